"""The exporters: the trained embedded checkpoint rewritten into the folders other engines load.

"Export" as the project's commands and the field use it (a checkpoint written out in another
runtime's format, as `torch.export` or an `optimum` export does): the embedded engine serves
`models/embedded` as it is; vLLM and SGLang need their own layouts, and the GPU suites need
a quantized target and a 27B-class stand-in. Each exporter is a command of `specrepro`:

- `drafters.py`: `specrepro export-drafters`, each drafter in the folder vLLM 0.26.0 or
  SGLang 0.5.14 loads (`build/engine-drafters/<engine>/<name>/`); also the folder helpers the
  others share (`file_sha256`, `new_folder`, `write_checkpoint`, `readable_by_all`, the
  drafters' configs).
- `fp8_drafter.py`: `specrepro export-fp8-drafter`, a block drafter as the FP8 checkpoint
  vLLM 0.26.0 loads as FP8 (`build/standin/vllm/dflash-fp8/`).
- `nvfp4.py`: `specrepro export-nvfp4`, the target as an NVFP4 checkpoint in
  compressed-tensors' layout (`build/nvfp4-target/`).
- `standin.py`: `specrepro export-standin`, the target and drafters inflated to a declared
  byte budget (`params/standin/*.yaml`), each folder's recipe in `standin.json`.
- `inflate.py`: the stand-in's construction on state dicts (hidden copies, twin units, twin
  layers: the same function in more bytes), which `standin.py` writes out.

Tooling (`specrepro.tools`), not the engine: the exporters read the engine's checkpoint
format and model (`specrepro.embedded`); the engine imports nothing from here, and the
harness only reads the folders they write (by path, fingerprinted by `identity.py`). They
run on the GPU image, so they import the embedded engine's libraries only
(tests/test_boundaries.py). This `__init__` imports nothing.
"""
