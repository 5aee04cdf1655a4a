"""The `detq` command line on click: one module per role (jobs, schedules, workers, admin, demos)."""
