"""The whole local stack: ``strata up | down | status | logs``.

``up`` starts the infrastructure (unless pointed at existing clusters) and a supervisor process that
runs every service as its own child process, restarts crashed ones with backoff and records what it
did in ``<state_dir>/stack.json``. ``down`` asks the supervisor to stop: each service gets SIGTERM,
drains, commits its offsets and exits; nothing is lost.
"""
