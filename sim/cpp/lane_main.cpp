// Verilator harness of the decoder lane (hw/lane.py): runs every clock in C++.
//
// Reads jobs from stdin and writes results to stdout, both little-endian binary:
//   job:    u32 n_bytes (0xFFFFFFFF ends the run), u8 bytes[n_bytes], u32 ready_percent
//   result: u32 status, u64 cycles (first input beat to done), u64 info (FrameInfo bits),
//           u32 n_beats, u32 words, then n_beats x words x u32 output beat payloads
// The file is offered 4 bytes per clock. A lane that is not done within
// 64 * n_bytes + 100000 clocks reports status 0xFFFFFFFF and is reset.
// Verilator spells the ports a__b as a___05Fb.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "Vlane.h"
#include "verilated.h"

static const uint32_t kWords = sizeof(((Vlane *)nullptr)->o___05Fpayload) / 4;

static bool read_all(void *dst, size_t n) { return fread(dst, 1, n, stdin) == n; }

static void tick(Vlane *top) {
    top->clk = 1;
    top->eval();
    top->clk = 0;
    top->eval();
}

int main(int argc, char **argv) {
    Verilated::commandArgs(argc, argv);
    auto *top = new Vlane;
    top->clk = 0;
    top->rst = 1;
    top->eval();
    tick(top);
    tick(top);
    top->rst = 0;
    for (;;) {
        uint32_t n_bytes, ready_percent;
        if (!read_all(&n_bytes, 4) || n_bytes == 0xFFFFFFFFu) break;
        std::vector<uint8_t> bytes(n_bytes);
        if (!read_all(bytes.data(), n_bytes) || !read_all(&ready_percent, 4)) return 1;
        std::vector<uint32_t> out;
        uint64_t cycles = 0, bound = 64ull * n_bytes + 100000;
        uint32_t status = 0xFFFFFFFFu, lfsr = 1;
        uint64_t info = 0;
        size_t pos = 0;
        for (;;) {
            bool have = pos < n_bytes;
            uint32_t n = have ? (uint32_t)std::min<size_t>(4, n_bytes - pos) : 0;
            uint64_t data = 0;
            for (uint32_t j = 0; j < n; ++j) data |= (uint64_t)bytes[pos + j] << (8 * j);
            bool last = have && pos + n >= n_bytes;
            top->input___05Fpayload = data | ((uint64_t)n << 32) | ((uint64_t)last << 35);
            top->input___05Fvalid = have;
            lfsr ^= lfsr << 13; lfsr ^= lfsr >> 17; lfsr ^= lfsr << 5;
            bool ready = ready_percent >= 100 || (lfsr % 100) < ready_percent;
            top->o___05Fready = ready;
            top->eval();
            bool in_fire = have && top->input___05Fready;
            if (top->o___05Fvalid && ready)
                for (uint32_t w = 0; w < kWords; ++w) out.push_back(top->o___05Fpayload[w]);
            bool done = top->done;
            if (done) {
                status = top->status;
                info = top->info;
            }
            tick(top);
            ++cycles;
            if (in_fire) pos += n;
            if (done && pos >= n_bytes) break;
            if (cycles > bound) {
                top->rst = 1;
                tick(top);
                top->rst = 0;
                break;
            }
        }
        uint32_t n_beats = (uint32_t)(out.size() / kWords);
        fwrite(&status, 4, 1, stdout);
        fwrite(&cycles, 8, 1, stdout);
        fwrite(&info, 8, 1, stdout);
        fwrite(&n_beats, 4, 1, stdout);
        fwrite(&kWords, 4, 1, stdout);
        fwrite(out.data(), 4, out.size(), stdout);
        fflush(stdout);
    }
    top->final();
    delete top;
    return 0;
}
