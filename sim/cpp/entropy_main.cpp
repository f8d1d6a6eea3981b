// Verilator harness of the entropy decoder core: runs every clock in C++.
//
// Reads jobs from stdin and writes results to stdout, both little-endian binary:
//   job:    u32 n_writes, u32 writes[n_writes] (TableWrite payloads),
//           u32 scan[3] (ScanConfig payload, 74 bits), u32 n_bytes, u8 bytes[n_bytes],
//           u32 ready_percent (100 = coefficient output always ready), u32 seed
//   result: u32 status, u32 symbols, u64 cycles, u32 n_beats,
//           then n_beats x (u64 low, u32 high) CoefBeat payloads (66 bits)
// A job with n_writes = 0xFFFFFFFF ends the run. A job whose decode does not finish within
// (16 * n_bytes + 4096) * 100 / ready_percent clocks reports status 0xFFFFFFFF.
// Verilator spells the ports a__b as a___05Fb.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "Ventropy_decoder.h"
#include "verilated.h"
#include "harness.h"

int main(int argc, char **argv) {
    Verilated::commandArgs(argc, argv);
    auto *top = new Ventropy_decoder;
    top->clk = 0;
    reset(top, 2);
    for (;;) {
        uint32_t n_writes;
        if (!read_all(&n_writes, 4) || n_writes == 0xFFFFFFFFu) break;
        std::vector<uint32_t> writes(n_writes);
        uint32_t scan[3], n_bytes, ready_percent, seed;
        if (!read_all(writes.data(), 4ull * n_writes) || !read_all(scan, 12) || !read_all(&n_bytes, 4)) return 1;
        std::vector<uint8_t> bytes(n_bytes);
        if (!read_all(bytes.data(), n_bytes) || !read_all(&ready_percent, 4) || !read_all(&seed, 4)) return 1;

        for (uint32_t w : writes) {
            top->tables___05Fpayload = w;
            top->tables___05Fvalid = 1;
            settle(top);
            while (!top->tables___05Fready) {  // the lookahead fill holds the writes
                tick(top);
            }
            tick(top);
        }
        top->tables___05Fvalid = 0;
        top->scan[0] = scan[0];
        top->scan[1] = scan[1];
        top->scan[2] = scan[2];
        top->start = 1;
        tick(top);
        top->start = 0;

        std::vector<uint64_t> lows;
        std::vector<uint32_t> highs;
        uint64_t cycles = 0;
        uint64_t bound = (16ull * n_bytes + 4096) * 100 / std::max<uint32_t>(1, std::min<uint32_t>(100, ready_percent));
        size_t pos = 0;
        Chance chance(seed);
        uint32_t status = 0xFFFFFFFFu;
        for (;;) {
            InputChunk chunk = input_chunk(bytes, pos);
            bool have = chunk.n != 0;
            uint32_t n = chunk.n;
            top->input___05Fpayload = chunk.payload;
            top->input___05Fvalid = have;
            bool ready = chance(ready_percent);
            top->coef___05Fready = ready;
            settle(top);
            bool in_fire = have && top->input___05Fready;
            if (top->coef___05Fvalid && ready) {
                lows.push_back((uint64_t)top->coef___05Fpayload[0] | ((uint64_t)top->coef___05Fpayload[1] << 32));
                highs.push_back(top->coef___05Fpayload[2]);
            }
            bool done = top->done;
            if (done) status = top->status;
            uint32_t symbols = top->symbols;
            rise(top);
            ++cycles;
            if (in_fire) pos += n;
            if (done) {
                uint32_t head[2] = {status, symbols};
                fwrite(head, 4, 2, stdout);
                break;
            }
            if (cycles > bound) {
                uint32_t head[2] = {0xFFFFFFFFu, symbols};
                fwrite(head, 4, 2, stdout);
                reset(top, 1);  // recover for the next job
                break;
            }
        }
        uint32_t n_beats = (uint32_t)lows.size();
        fwrite(&cycles, 8, 1, stdout);
        fwrite(&n_beats, 4, 1, stdout);
        for (size_t i = 0; i < lows.size(); ++i) {
            fwrite(&lows[i], 8, 1, stdout);
            fwrite(&highs[i], 4, 1, stdout);
        }
        fflush(stdout);
    }
    top->final();
    delete top;
    return 0;
}
