# Sourced at the start of every GPU-machine command: installs the carried wheels (see
# ../shared/gpu/README.md) and points Python at them and at this checkout. DRY=1 (a CPU
# check of the scripts) uses the local environment instead.
if [ "${DRY:-0}" != 1 ]; then
  # once per machine: scripts run side by side on separate GPUs source this too
  [ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site ${WHL:-.whl}/*.whl && touch /tmp/site/.installed; } || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
