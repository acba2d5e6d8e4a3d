"""Layer 6, measurement: timing primitives, alternating rounds with a median and range,
`auto` settled by measuring (`autotune`), the probes of a run in this process and where a
multi-process run trained (`in_place`), a pipeline's step taken apart, and the diagnosis:
the bottleneck class and its advice."""
