# Nsight Compute on the fused kernels of one AD-size block (one GPU, ncu_kernels.py): per
# kernel, the launch (registers, occupancy), throughput against the memory and compute ceilings,
# and where warps stall; the second of two forward + backward calls, one launch of each kernel.
#   bash experiments/gpu/ncu.sh   (under $OUT: ncu_summary.txt, ncu_details.csv, ncu_raw.csv,
#                                  ncu_sass.tgz: per-instruction stall samples, kernels.ncu-rep)
source experiments/gpu/setup.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
KERNELS='regex:^(forward_kernel|backward_kernel|input_backward_kernel|finish_block_.*)$'
# ncu's replays save and restore the memory a kernel may write: allocate what the program needs
# rather than JAX's default 75% of the GPU in one block.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# XLA's gemm autotuning would run hundreds of cuBLAS kernels under ncu's interception: off
# (it does not touch the Pallas kernels being profiled).
XLA_FLAGS="--xla_gpu_autotune_level=0" timeout ${NCU_TIMEOUT:-300} $NCU --target-processes application-only --clock-control none -k "$KERNELS" \
  --launch-skip 6 --launch-count 6 --section LaunchStats --section Occupancy --section SpeedOfLight \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section SchedulerStats --section InstructionStats --section SourceCounters -f -o /tmp/kernels \
  python3 experiments/gpu/ncu_kernels.py 2>&1 | tee $OUT/ncu_log.txt | tail -30
$NCU -i /tmp/kernels.ncu-rep --page details --csv > $OUT/ncu_details.csv
$NCU -i /tmp/kernels.ncu-rep --page raw --csv > $OUT/ncu_raw.csv
# Per-instruction stall samples (SASS) of the first launch of each kernel.
for k in forward_kernel backward_kernel input_backward_kernel finish_block_forward \
         finish_block_backward_rows finish_block_backward_weights; do
  $NCU -i /tmp/kernels.ncu-rep -k "regex:^$k\$" --launch-count 1 --page source --print-source sass --csv \
    > /tmp/sass_$k.csv 2>&1 || echo "source page failed for $k"
done
tar czf $OUT/ncu_sass.tgz -C /tmp $(cd /tmp && ls sass_*.csv)
python3 experiments/gpu/ncu_summary.py $OUT/ncu_details.csv /tmp/sass_*.csv | tee $OUT/ncu_summary.txt
cp /tmp/kernels.ncu-rep $OUT/ 2>/dev/null  # for the Nsight Compute GUI (~13 MB)
