# Session 15, call 2, on a four-GPU machine (asked for as nvidia-h100-x4): issue 9's 1-, 2- and
# 4-GPU scaling at the current code (session 9's 4-GPU run predates the flattened optimizer
# and the kernels).
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $OUT/cards.txt
DEVICES="1 2 4" timeout 560 bash experiments/gpu/scaling.sh 2>&1 | grep -v "^update \|^\[Gloo\]\|WARNING" | tail -40
