# Source on the GPU machine (no network) from the repository root:  source benchmarks/gpu_env.sh
# Installs the wheels carried in .whl/ (flashinfer-python 0.5.3, apache-tvm-ffi 0.1.3, pluggy,
# gguf, flit_core: download them here first, see docs/benchmarks/attention-h200.md) and the
# core's GPU-relevant plugins (real entry points) into /tmp, and exports the environment.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD/core
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
  --target /tmp/site2 plugins/attention/{torch_native,triton,flashinfer,flex_attention} \
  plugins/parsers/model-config-{hf,auto,mistral} plugins/quant/{gguf,unquant,fp8,gptq,awq,humming} \
  plugins/moe/{torch,triton,a2a-none} plugins/grammar/{llguidance,none} \
  plugins/spec/{ngram,standalone,eagle,eagle3,nextn,dflash,dspark,uno} || return 1
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD/core
# the quantization plugins, importable (benchmarks/quant_gpu.py loads each choice's method)
for d in plugins/quant/*/; do PYTHONPATH=$PYTHONPATH:$PWD/$d; done
export PYTHONPATH
# The server's own dependencies (fastapi, uvicorn, pydantic, llguidance...), carried as wheels in
# .whl-server/ when a run starts `engine serve` there. Fetch them here with:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl-server \
#     fastapi uvicorn pydantic prometheus-client llguidance jsonschema httpx pyyaml
if compgen -G ".whl-server/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-server \
    .whl-server/*.whl || return 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site-server
fi
export CUDA_HOME=/usr/local/cuda FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
# The other grammar backends (xgrammar 0.2.9, outlines-core 0.2.14, and the apache-tvm-ffi
# 0.1.15 xgrammar needs), carried in .whl-grammar/ for the grammar benchmark. xgrammar's
# tvm-ffi is newer than the one flashinfer 0.5.3 was built against, so they go into their own
# directory: put it first on PYTHONPATH only for a run that needs them (`$ENGINE_GRAMMAR_PATH`).
# Fetch them here with:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 -d .whl-grammar \
#     xgrammar==0.2.9 outlines-core==0.2.14 apache-tvm-ffi==0.1.15.post2
if compgen -G ".whl-grammar/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /tmp/site-grammar .whl-grammar/*.whl || return 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target /tmp/site-grammar plugins/grammar/{xgrammar,outlines} || return 1
  export ENGINE_GRAMMAR_PATH=/tmp/site-grammar
fi
