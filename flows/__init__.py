"""Layer 10, the ways in: the `tfscale` command (`cli`, `commands`), the Prefect flows that
order the steps of `tasks/` (`study`, `sweep`, `pool`, with their cache policies in
`caching`), the deployments `tfscale serve` registers, the temporary Prefect API, and the
worker process's entry point (`worker`)."""
