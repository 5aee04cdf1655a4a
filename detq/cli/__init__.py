"""The `detq` command line on click: one module per role (jobs, schedules, workers, admin, demos)."""

import gc

# A command's start-up is imports: some 300,000 objects that live as long as it does. At Python's default
# thresholds the collector walked them about 200 times during a `detq enqueue` (45-70 ms of its 0.4-0.5 s);
# at these, about 13 times (about 20 ms). DetqCommand.invoke then freezes what the imports made.
GC_THRESHOLDS = (10_000, 50, 100)
gc.set_threshold(*GC_THRESHOLDS)
