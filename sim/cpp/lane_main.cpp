// Verilator harness of the decoder lane (hw/lane.py): runs every clock in C++.
//
// Reads jobs from stdin and writes results to stdout, both little-endian binary:
//   job:    u32 n_bytes (0xFFFFFFFF ends the run), u8 bytes[n_bytes], u32 ready_percent
//   result: u32 status, u64 cycles (first input beat to done), u64 info (FrameInfo bits),
//           u32 n_beats, u32 words, then n_beats x words x u32 output beat payloads
// The file is offered 4 bytes per clock. A lane that is not done within
// 64 * n_bytes + 4 * width * height + 100000 clocks (width and height as the lane's
// FrameInfo reports them) reports status 0xFFFFFFFF and is reset.
// Verilator spells the ports a__b as a___05Fb.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "Vlane.h"
#include "verilated.h"
#include "harness.h"

static const uint32_t kWords = sizeof(((Vlane *)nullptr)->o___05Fpayload) / 4;

int main(int argc, char **argv) {
    Verilated::commandArgs(argc, argv);
    auto *top = new Vlane;
    top->clk = 0;
    top->reset = 0;   // the lane's own reset input; rst resets it here
    reset(top, 2);
    for (;;) {
        uint32_t n_bytes, ready_percent;
        if (!read_all(&n_bytes, 4) || n_bytes == 0xFFFFFFFFu) break;
        std::vector<uint8_t> bytes(n_bytes);
        if (!read_all(bytes.data(), n_bytes) || !read_all(&ready_percent, 4)) return 1;
        std::vector<uint32_t> out;
        uint64_t cycles = 0, bound = 64ull * n_bytes + 100000;
        bool bound_has_frame = false;
        uint32_t status = 0xFFFFFFFFu;
        Chance chance(1);
        uint64_t info = 0;
        size_t pos = 0;
        for (;;) {
            InputChunk chunk = input_chunk(bytes, pos);
            bool have = chunk.n != 0;
            uint32_t n = chunk.n;
            top->input___05Fpayload = chunk.payload;
            top->input___05Fvalid = have;
            bool ready = chance(ready_percent);
            top->o___05Fready = ready;
            settle(top);
            bool in_fire = have && top->input___05Fready;
            if (top->o___05Fvalid && ready) push_words(out, top->o___05Fpayload);
            bool done = top->done;
            if (done) {
                status = top->status;
                info = top->info;
            }
            rise(top);
            ++cycles;
            if (in_fire) pos += n;
            if (done && pos >= n_bytes) break;
            if (cycles > bound && !bound_has_frame) {
                uint64_t frame = top->info;   // FrameInfo: width in bits 0-15, height 16-31
                bound += 4ull * (frame & 0xFFFF) * ((frame >> 16) & 0xFFFF);
                bound_has_frame = true;
            }
            if (cycles > bound) {
                reset(top, 1);
                break;
            }
        }
        uint32_t n_beats = (uint32_t)(out.size() / kWords);
        write_value(status);
        write_value(cycles);
        write_value(info);
        write_value(n_beats);
        write_value(kWords);
        fwrite(out.data(), 4, out.size(), stdout);
        fflush(stdout);
    }
    top->final();
    delete top;
    return 0;
}
