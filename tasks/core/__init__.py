"""Layer 1, the foundation: what every other layer may use and nothing here needs from them.
The one error type users cause, atomic files, process-wide state (devices, precision, log
levels, exit), stage lines and progress, charts, ports and health waits, the code version,
what else loaded the machine while something was measured, the run directory's lock, and
every use of a library's private internals."""
