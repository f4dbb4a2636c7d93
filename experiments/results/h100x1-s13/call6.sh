# Session 13, call 6 (on top of BACKWARD_SEQS=2): the token embedding's bias folded into its
# matmul (a ones column: no separate pass to add it, none to sum its gradient), and the MLP
# weight-gradient kernel on 32-wide hidden chunks (half the accumulator registers a program).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base "emb:transformer.EMBED_BIAS_IN_MATMUL=True" \
  "w32:fused_mlp.WEIGHTS_BLOCK_HIDDEN=32" \
  "w32rg16:fused_mlp.WEIGHTS_BLOCK_HIDDEN=32;fused_mlp.finish_block=partial(row_groups=16)" \
  "w32rg64:fused_mlp.WEIGHTS_BLOCK_HIDDEN=32;fused_mlp.finish_block=partial(row_groups=64)" \
  "w32r128:fused_mlp.WEIGHTS_BLOCK_HIDDEN=32;fused_mlp.finish_block=partial(weights_block_rows=128)" \
  --rounds 2 2>&1 | tee $OUT/emb_w32_ab.txt
