# Profiling call for the PPO update and the AD-size transformer step (one GPU): times the
# previous version (ab_old/, an untracked copy carried along, when present), this version and
# reference_ppo, with jax.profiler traces summarized by trace_summary.py, and the optimized HLO
# of the AD-size transformer step.
#   bash experiments/gpu/profile.sh
source experiments/gpu/setup.sh
B="--envs-per-device 2048 16384 --devices 1 --updates 5 --repeats 7"
T="--transformer-step --d-model 128 --n-layers 4 --context-len 80 --batch 4096 --precisions bf16 --repeats 10"
old() { (cd ab_old && PYTHONPATH=/tmp/site:$PWD python3 -m jaxrl_mgpu.bench "$@") 2>&1 | grep -v "^{"; }
new() { (cd ${NEW:-.} && PYTHONPATH=/tmp/site:$PWD python3 -m jaxrl_mgpu.bench "$@") 2>&1 | grep -v "^{"; }
if [ -d ab_old/jaxrl_mgpu ]; then old $B | tee $OUT/old.txt; old $T --n-heads 4 --attention cudnn | tee -a $OUT/old.txt; fi
new $B --baseline --profile /tmp/prof | tee $OUT/new.txt
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" new $T --n-heads 4 --attention xla cudnn --profile /tmp/prof | tee $OUT/tstep.txt
new $T --n-heads 2 --attention cudnn | tee -a $OUT/tstep.txt
python3 experiments/gpu/trace_summary.py /tmp/prof > $OUT/traces.txt
tar czf $OUT/traces.tgz $(find /tmp/prof -name "*.trace.json.gz") $(find /tmp/dump -name "*after_optimizations.txt")
ls -la $OUT
