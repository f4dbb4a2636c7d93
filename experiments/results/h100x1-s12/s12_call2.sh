# Session 12, call 2: ptxas register caps (XLA's --xla_gpu_ptx_compiler_extra_flags) on the
# AD-size step with both kernels; do they reach the Pallas (Triton) kernels, and do 3-4 programs
# an SM beat 2?
step() {  # name, extra ptxas flags, profile dir or ""
  XLA_FLAGS="${2:+--xla_gpu_ptx_compiler_extra_flags=$2}" python3 -m jaxrl_mgpu.bench --transformer-step \
    --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --batch 4096 --precisions bf16 --attention pallas \
    --mlp pallas --repeats 10 ${3:+--profile $3} 2>&1 | grep -E "^d128|ceiling" | sed "s/^/$1  /"
}
for round in 0 1; do
  for v in "base:" "r168:--maxrregcount=168" "r128:--maxrregcount=128" "r64:--maxrregcount=64"; do
    name=${v%%:*}; flags=${v#*:}
    [ $round = 1 ] && [ $name = r64 ] && continue
    step $name "$flags" "$([ $round = 0 ] && echo /tmp/prof_$name)" | tee -a $OUT/regcap_ab.txt
  done
done
for name in base r168 r128 r64; do
  echo "== $name"; python3 experiments/gpu/trace_summary.py /tmp/prof_$name 2>&1 | sed -n 2,12p
done | tee $OUT/regcap_traces.txt
