// Kernels for the host-side microbenchmarks (kernels/host_microbench.py runs them): what a launch
// costs the host, the gap between two queued kernels on the GPU, and how many launches queue.
//
// Every kernel runs one thread of one block. %globaltimer is the GPU's nanosecond clock, shared
// by all SMs (clock64 counts per SM, so two kernels on two SMs could not be compared with it).
//
// - hbmsim_empty: does nothing (the launch rate, and the queue depth behind hbmsim_spin).
// - hbmsim_spin: holds the GPU for `ns` nanoseconds, so that the host can queue launches behind it.
// - hbmsim_stamp: writes the global timer at its entry and its exit into stamps[2i], stamps[2i+1]
//   (spinning `ns` between): a tiny kernel whose own device time it measures itself.
// - hbmsim_block_starts: the one kernel of many blocks (1024 threads each, so an SM holds two):
//   each block's first thread writes the global timer at its entry and the SM it runs on (%smid),
//   then spins `ns`, so that the blocks of the first wave are all resident at once and the
//   spread of their entries is how long the block scheduler took to hand them out.

__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void hbmsim_empty() {}

extern "C" __global__ void hbmsim_spin(unsigned long long ns) {
    unsigned long long t0 = globaltimer_ns();
    while (globaltimer_ns() - t0 < ns) { }
}

extern "C" __global__ void hbmsim_stamp(unsigned long long* stamps, int i, unsigned long long ns) {
    unsigned long long t0 = globaltimer_ns();
    unsigned long long t = t0;
    while (t - t0 < ns) { t = globaltimer_ns(); }
    stamps[2 * i] = t0;
    stamps[2 * i + 1] = globaltimer_ns();
}

extern "C" __global__ void hbmsim_block_starts(unsigned long long* starts, unsigned* smids, unsigned long long ns) {
    unsigned long long t0 = globaltimer_ns();
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        starts[blockIdx.x] = t0;
        smids[blockIdx.x] = smid;
    }
    while (globaltimer_ns() - t0 < ns) { }
}
