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
