"""The harness: start or attach to an engine, drive it over HTTP, and measure it.

Engines (vLLM, SGLang, the embedded engine, or a URL someone else started) are
reached over HTTP only; `engines` holds one adapter per engine (its flags, checked and
rendered by `flags` against the generated lists in `engine_cli/`, its routes, log lines,
metric names and acceptance source) and turns a profile into a running server, held as an
`engine_handle.EngineHandle`; `promtext` reads its Prometheus counters by the adapter's
metric names, the load generator sends the requests, `cells` turns what a cell measured
into its rows and the runner writes cells and requests to the results store.
"""
