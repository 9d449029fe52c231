#!/bin/sh
# bench/gpu.sh - mlc's OpenCL backend on a GPU, with PyTorch's CUDA on the same GPU as the peer.
# Runs bench/gpu.c and bench/torch_gpu.py (sgemm, training steps), plaidbench's MobileNetV2 on the
# GPU beside PyTorch CUDA, the MobileNetV2 check against torchvision's outputs on the GPU (when
# build/gpu-data holds tools/export_mobilenet.py's files), then the whole test suite on the GPU
# (MLC_DEVICE); logs go to $OUT (default build/gpu-out). Expects the binaries built here by
# `make bench-gpu-build` (build/test-opencl-gpu, build/bench-gpu, build/plaidbench-gpu,
# build/mobilenet-gpu) and, where the machine has no OpenCL loader, Debian's libOpenCL.so.1 in
# build/ocl. NVIDIA's OpenCL driver is named to the loader alone (OCL_ICD_VENDORS,
# OCL_ICD_FILENAMES), and the device is picked by kind all the same: the first GPU mlc lists
# (on the lent H200 the loader still listed PoCL first). Arguments go to bench-gpu; with
# --gemm-only the suite, plaidbench and the training steps are left out.
set -u
out=${OUT:-build/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
if ! ldconfig -p | grep -q 'libOpenCL.so.1'; then
    export LD_LIBRARY_PATH="$PWD/build/ocl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "OpenCL loader: build/ocl (carried)"
fi
lib=$(cat /etc/OpenCL/vendors/nvidia*.icd 2>/dev/null | head -1)
[ -n "$lib" ] || lib=$(find /usr /lib /lib64 /opt -name 'libnvidia-opencl.so.1' 2>/dev/null | head -1)
[ -n "$lib" ] || lib=$(find /usr /lib /lib64 /opt -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
echo "OpenCL driver: ${lib:-none found (the drivers registered here)}"
[ -z "$lib" ] || { mkdir -p /tmp/icd && echo "$lib" > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd \
                   OCL_ICD_FILENAMES="$lib"; }
./build/test-opencl-gpu --devices 2>&1 | tee /tmp/devices.txt
gpu=$(grep -m1 '(gpu' /tmp/devices.txt | cut -d: -f1)
export MLC_DEVICE=${MLC_DEVICE:-opencl:${gpu:-0}}
echo "device: $MLC_DEVICE"
gemm_only=; case " $* " in *" --gemm-only "*) gemm_only=--gemm-only;; esac
lines="stdbuf -oL"; command -v stdbuf >/dev/null || lines=
timeout 100 $lines ./build/bench-gpu "$@" > "$out/gpu.txt" 2>&1
echo "bench-gpu rc $?"
PYTHONUNBUFFERED=1 timeout 120 python3 bench/torch_gpu.py data/digits.bin 256,512,1024,2048,4096 $gemm_only \
    > "$out/torch.txt" 2>&1
echo "torch_gpu rc $?"
if [ -z "$gemm_only" ]; then
    PYTHON=python3 timeout 120 $lines ./build/plaidbench-gpu --device "$MLC_DEVICE" --runs 5 > "$out/plaidbench.txt" 2>&1
    echo "plaidbench rc $?"; cat "$out/plaidbench.txt"
    for w in 035 100; do
        [ -f build/gpu-data/mobilenet$w.ref.safetensors ] || { echo "no build/gpu-data: no MobileNet check"; break; }
        timeout 45 ./build/mobilenet-gpu --device "$MLC_DEVICE" --width $(echo $w | sed 's/^0/0./; s/^100$/1.0/') \
            --check build/gpu-data/mobilenet$w 2>&1 | tee "$out/mobilenet$w.txt" | tail -12
    done
    start=$(date +%s)
    timeout 200 $lines ./build/test-opencl-gpu > "$out/test-opencl.log" 2>&1
    echo "suite on the GPU: rc $? in $(( $(date +%s) - start )) s: $(tail -1 "$out/test-opencl.log")"
    grep -E "^FAIL|fail" "$out/test-opencl.log" | head -20
fi
cat "$out/gpu.txt" "$out/torch.txt"
# the summary: mlc against the peer's best, as ratios (a GEMM over cuBLAS; a step: the peer's
# time over mlc's, so above 1 is mlc faster)
cat "$out/gpu.txt" "$out/torch.txt" | awk '
    { v[$1] = $2 }
    END {
        print "| sgemm n | mlc TFLOP/s | cuBLAS TFLOP/s | mlc / cuBLAS |"; print "|---:|---:|---:|---:|"
        for (n = 256; n <= 4096; n *= 2)
            if (v["gemm_" n "_tflops"] && v["torch_gemm_" n "_tflops"])
                printf "| %d | %.2f | %.2f | %.2f |\n", n, v["gemm_" n "_tflops"], v["torch_gemm_" n "_tflops"],
                       v["gemm_" n "_tflops"] / v["torch_gemm_" n "_tflops"]
        print ""; print "| step | mlc µs (kernels) | PyTorch µs (kernels), best of foreach / fused AdamW | PyTorch / mlc |"
        print "|---|---:|---:|---:|"
        split("mlp cnn wide_mlp wide_mlp_bf16 fashion_cnn fashion_cnn_bf16", models, " ")
        for (i = 1; i <= 6; i++) {
            m = models[i]; t = v["torch_step_" m "_us"]; k = v["torch_step_" m "_kernels"]
            if (v["torch_step_" m "_fused_us"] && (!t || v["torch_step_" m "_fused_us"] < t)) {
                t = v["torch_step_" m "_fused_us"]; k = v["torch_step_" m "_fused_kernels"]
            }
            if (v["step_" m "_us"] && t)
                printf "| %s%s | %.1f (%d) | %.1f (%d) | %.2f |\n", i <= 2 ? "digits " : "batch 512 ", m, v["step_" m "_us"], v["step_" m "_launches"],
                       t, k, t / v["step_" m "_us"]
        }
    }' | tee "$out/summary.md"
