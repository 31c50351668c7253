// Host-side check of dspark patch 0008's graph counters: ggml_cuda_graph_counts is cut out of the patched
// ggml-cuda/common.cuh (COUNTS.inc) and compiled here; a scripted sequence of graph computes is counted.
#include <cstdint>
#include <cstdio>

#include "COUNTS.inc"

int main() {
    ggml_cuda_graph_counts st;
    int lines = 0;
    // the life of one cached graph as ggml_backend_cuda_graph_compute sees it: two warm-up computes run
    // directly, one capture, replays, a properties change (reset, direct), warm-up, capture, replays
    const bool used[]    = {false, true, true, true, false, true, true};
    const bool capture[] = {false, true, false, false, false, true, false};
    const bool reset[]   = {false, false, false, false, true, false, false};
    for (int round = 0; round < 128; round++) {
        for (int i = 0; i < 7; i++) {
            lines += st.note(used[i], capture[i], reset[i]);
        }
    }
    std::printf("computes %llu launched %llu captured %llu resets %llu direct %llu lines %d\n",
                (unsigned long long) st.computes, (unsigned long long) st.launched,
                (unsigned long long) st.captured, (unsigned long long) st.resets,
                (unsigned long long) st.direct, lines);
    return 0;
}
