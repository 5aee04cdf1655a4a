"""Scheduled runs: schedules, cron, Celery beat with a database lease, and the control task that scans."""
