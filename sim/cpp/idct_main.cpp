// Verilator harness of the IDCT core (hw/idct.py): runs every clock in C++.
//
// Reads jobs from stdin and writes results to stdout, both little-endian binary:
//   job:    u32 n_quant, u32 quant[n_quant] (QuantWrite payloads),
//           u32 n_beats, n_beats x (u64 low, u32 high) CoefBeat payloads (66 bits),
//           u32 n_blocks (blocks those beats hold), u32 first_end (index of block 0's last beat),
//           u32 valid_percent, u32 ready_percent, u32 seed
//   result: u32 ok, u64 cycles, u32 latency, u32 n_beats, u32 words,
//           then n_beats x words x u32: output beat payloads (block_rows(lanes))
// Compile with -DLANES=n (rows per output beat).
// A job with n_quant = 0xFFFFFFFF ends the run. The job ends when all beats of every block
// have come out (ok = 1) or after (n_beats + 16 * blocks + 256) * 200 / min(valid, ready)
// clocks (ok = 0: the core hung). Verilator spells the ports a__b as a___05Fb.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "Vidct.h"
#include "verilated.h"
#include "harness.h"

// 32-bit words of an output beat (the payload width depends on the core's lanes).
static const uint32_t kLanes = LANES;
static const uint32_t kRowWords = sizeof(((Vidct *)nullptr)->o___05Fpayload) / 4;

int main(int argc, char **argv) {
    Verilated::commandArgs(argc, argv);
    auto *top = new Vidct;
    top->clk = 0;
    reset(top, 2);
    for (;;) {
        uint32_t n_quant, n_beats, valid_percent, ready_percent, seed;
        if (!read_all(&n_quant, 4) || n_quant == 0xFFFFFFFFu) break;
        std::vector<uint32_t> quant(n_quant);
        if (!read_all(quant.data(), 4ull * n_quant) || !read_all(&n_beats, 4)) return 1;
        std::vector<uint64_t> lows(n_beats);
        std::vector<uint32_t> highs(n_beats);
        for (uint32_t i = 0; i < n_beats; ++i)
            if (!read_all(&lows[i], 8) || !read_all(&highs[i], 4)) return 1;
        uint32_t n_blocks, first_end;
        if (!read_all(&n_blocks, 4) || !read_all(&first_end, 4) || !read_all(&valid_percent, 4) || !read_all(&ready_percent, 4) || !read_all(&seed, 4)) return 1;

        for (uint32_t q : quant) {  // always ready
            top->quant___05Fpayload = q;
            top->quant___05Fvalid = 1;
            tick(top);
        }
        top->quant___05Fvalid = 0;

        uint64_t blocks = n_blocks;
        uint32_t slowest = std::max<uint32_t>(1, std::min(std::min(valid_percent, ready_percent), 100u));
        uint64_t bound = (n_beats + 16 * blocks + 256) * 200 / slowest;
        Chance chance(seed);
        std::vector<uint32_t> out;
        uint64_t cycles = 0, last0 = 0;
        uint32_t latency = 0;
        size_t pos = 0;
        while (out.size() < (size_t)kRowWords * (8 / kLanes) * blocks && cycles <= bound) {
            bool offer = pos < n_beats && chance(valid_percent);
            bool ready = chance(ready_percent);
            if (offer) {
                top->coef___05Fpayload[0] = (uint32_t)lows[pos];
                top->coef___05Fpayload[1] = (uint32_t)(lows[pos] >> 32);
                top->coef___05Fpayload[2] = highs[pos];
            }
            top->coef___05Fvalid = offer;
            top->o___05Fready = ready;
            settle(top);
            bool fire = offer && top->coef___05Fready;
            if (fire && pos == first_end) last0 = cycles;

            if (top->o___05Fvalid && ready) {
                if (out.empty()) latency = (uint32_t)(cycles - last0);
                push_words(out, top->o___05Fpayload);
            }
            rise(top);
            ++cycles;
            if (fire) ++pos;
        }
        uint32_t ok = out.size() == (size_t)kRowWords * (8 / kLanes) * blocks;
        if (!ok) {  // recover for the next job
            reset(top, 1);
        }
        uint32_t n_rows = (uint32_t)(out.size() / kRowWords);
        write_value(ok);
        write_value(cycles);
        write_value(latency);
        write_value(n_rows);
        write_value(kRowWords);
        fwrite(out.data(), 4, out.size(), stdout);
        fflush(stdout);
    }
    top->final();
    delete top;
    return 0;
}
