# Session 13, call 3: BACKWARD_SEQS=2 as the base; the MLP weight-gradient kernel's settings
# re-tuned since it writes dh (session 12); then the registers and spills of every Pallas kernel
# (ptxas -v on the step's PTX) and what XLA's remaining reductions are.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base "b1:fused_attention.BACKWARD_SEQS=1" \
  "rg16:fused_mlp.finish_block=partial(row_groups=16)" "rg64:fused_mlp.finish_block=partial(row_groups=64)" \
  "wr128:fused_mlp.finish_block=partial(weights_block_rows=128)" \
  "ww8:fused_mlp.finish_block=partial(weights_num_warps=8)" \
  "wr32:fused_mlp.finish_block=partial(weights_block_rows=32)" \
  "bh128:fused_mlp.finish_block=partial(block_hidden=128)" \
  --rounds 2 2>&1 | tee $OUT/mlpw_ab.txt
rm -rf /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump" python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 \
  --n-heads 4 --context-len 80 --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 2 2>&1 | tail -2
PTXAS=$(find / -name ptxas -type f 2>/dev/null | head -1); echo "ptxas: $PTXAS"
ls -S /tmp/dump/*.ptx | head -3
for f in $(ls -S /tmp/dump/*.ptx | head -2); do $PTXAS -v --gpu-name sm_90a $f -o /dev/null 2>&1; done \
  | grep -E "entry function|registers|spill" | tee $OUT/ptxas.txt | head -80
H=$(ls -S /tmp/dump/*after_optimizations.txt | head -1); echo "$H"
python3 - "$H" <<'PY' | tee $OUT/fusions.txt
import re, sys
text = open(sys.argv[1]).read()
for name in ("input_reduce_fusion_5", "input_reduce_fusion_2", "input_reduce_fusion_78", "loop_add_fusion_5",
             "input_reduce_fusion_3"):
    m = re.search(r"\n\s*(?:ROOT )?%?" + name + r" = ([^\n]*)", text)
    if not m:
        print(name, "not found"); continue
    line = m.group(1); print(name, "=", line[:300])
    c = re.search(r"calls=(%?[\w.\-]+)", line)
    if c:
        body = re.search(r"\n" + re.escape(c.group(1)) + r" [^\n]*\{\n(.*?)\n\}", text, re.S)
        print("   " + "\n   ".join(l[:200] for l in (body.group(1).splitlines() if body else [])[:12]))
PY
