"""Engine: what keeps a run safe while it trains, and what it holds until it ends.

``resume_fingerprint`` (what a resume must not change), ``divergence`` (rules beyond NaN
that stop a run before its bad steps are saved), ``workdir_lock``
(one writer per workdir), ``watchdog`` (hangs: stacks written, exit for a restart) and
``holding`` (takes the lock, the watchdog, the goodput record and the SIGTERM flag after
every check and gives them back however the run ends).
"""
