"""The harness: start or attach to an engine, drive it over HTTP, and measure it.

Engines (vLLM, SGLang, the embedded engine, or a URL someone else started) are
reached over HTTP only; `engines` turns a profile into a running server,
`promtext` reads its Prometheus counters, the load generator sends the requests
and the runner writes cells and requests to the results store.
"""
