# Session 13, call 4: on top of BACKWARD_SEQS=2: d attn = dr @ wo^T inside the MLP rows kernel
# (ROWS_DATTN), the attention backward's warps, its loop unpipelined; then
# what XLA's small fusions are (in the step's optimised HLO).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base "da:fused_mlp.ROWS_DATTN=True" \
  "bw8:fused_attention.WARPS=(4, 8, 4)" "bs1:fused_attention.SEQ_STAGES=1" \
  "b1:fused_attention.BACKWARD_SEQS=1" \
  --rounds 2 2>&1 | tee $OUT/da_ab.txt
rm -rf /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=jit_step" python3 -m jaxrl_mgpu.bench --transformer-step \
  --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --batch 4096 --precisions bf16 --attention pallas \
  --mlp pallas --repeats 2 2>&1 | tail -1
H=$(ls -S /tmp/dump/*jit_step*after_optimizations.txt | head -1); echo "$H"
python3 - "$H" <<'PY' | tee $OUT/fusions.txt
import re, sys
text = open(sys.argv[1]).read()
for name in ("input_reduce_fusion.5", "input_reduce_fusion.2", "input_reduce_fusion.78", "loop_add_fusion.5",
             "input_reduce_fusion.3", "input_concatenate_fusion", "input_reduce_fusion.32"):
    m = re.search(r"\n\s*(?:ROOT )?%?" + re.escape(name).replace(r"\.", "[._]") + r" = ([^\n]*)", text)
    if not m:
        print(name, "not found"); continue
    line = m.group(1); print(name, "=", line[:400])
    c = re.search(r"calls=(%?[\w.\-]+)", line)
    if c:
        body = re.search(r"\n" + re.escape(c.group(1)) + r" [^\n]*\{\n(.*?)\n\}", text, re.S)
        print("   " + "\n   ".join(l[:220] for l in (body.group(1).splitlines() if body else [])[:14]))
PY
