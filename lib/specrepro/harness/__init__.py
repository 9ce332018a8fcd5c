"""The harness: start or attach to an engine, drive it over HTTP, and measure it.

Engines (vLLM, SGLang, the embedded engine, or a URL someone else started) are
reached over HTTP only; `engines` turns a profile into a running server (its flags
checked and rendered by `flags`, the running process held by `process`), `promtext`
reads its Prometheus counters, the load generator sends the requests, `cells` turns
what a cell measured into its rows and the runner writes cells and requests to the
results store.
"""
