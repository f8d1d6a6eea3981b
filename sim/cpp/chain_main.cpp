// Verilator harness of sim/chain.py (entropy decoder -> IDCT): runs every clock in C++.
//
// Reads jobs from stdin and writes results to stdout, both little-endian binary:
//   job:    u32 n_writes, u32 writes[n_writes] (TableWrite payloads),
//           u32 n_quant, u32 quant[n_quant] (QuantWrite payloads),
//           u32 scan[3] (ScanConfig payload), u32 n_bytes, u8 bytes[n_bytes],
//           u32 n_blocks (blocks the scan holds), u32 ready_percent, u32 seed
//   result: u32 status, u32 symbols, u64 done_cycles (start to the entropy decoder's
//           done), u64 cycles (start to the last row taken), u32 n_beats, u32 words,
//           then n_beats x words x u32: output beat payloads (block_rows(lanes))
// Compile with -DLANES=n (rows per output beat).
// A job with n_writes = 0xFFFFFFFF ends the run. After done, the harness waits for every
// output beat of every block when the status is 0 (for none otherwise); a core that does not finish within
// (16 * n_bytes + 16 * n_blocks + 4096) * 100 / ready_percent clocks reports status
// 0xFFFFFFFF. Verilator spells the ports a__b as a___05Fb.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "Vchain.h"
#include "verilated.h"
#include "harness.h"

// 32-bit words of an output beat (the payload width depends on the core's lanes).
static const uint32_t kLanes = LANES;
static const uint32_t kRowWords = sizeof(((Vchain *)nullptr)->o___05Fpayload) / 4;

int main(int argc, char **argv) {
    Verilated::commandArgs(argc, argv);
    auto *top = new Vchain;
    top->clk = 0;
    reset(top, 2);
    for (;;) {
        uint32_t n_writes, n_quant;
        if (!read_all(&n_writes, 4) || n_writes == 0xFFFFFFFFu) break;
        std::vector<uint32_t> writes(n_writes);
        if (!read_all(writes.data(), 4ull * n_writes) || !read_all(&n_quant, 4)) return 1;
        std::vector<uint32_t> quant(n_quant);
        uint32_t scan[3], n_bytes, n_blocks, ready_percent, seed;
        if (!read_all(quant.data(), 4ull * n_quant) || !read_all(scan, 12) || !read_all(&n_bytes, 4)) return 1;
        std::vector<uint8_t> bytes(n_bytes);
        if (!read_all(bytes.data(), n_bytes) || !read_all(&n_blocks, 4) || !read_all(&ready_percent, 4)
            || !read_all(&seed, 4)) return 1;

        for (uint32_t w : writes) {
            top->tables___05Fpayload = w;
            top->tables___05Fvalid = 1;
            settle(top);
            while (!top->tables___05Fready) tick(top);  // the lookahead fill holds the writes
            tick(top);
        }
        top->tables___05Fvalid = 0;
        for (uint32_t q : quant) {
            top->quant___05Fpayload = q;
            top->quant___05Fvalid = 1;
            tick(top);
        }
        top->quant___05Fvalid = 0;
        top->scan[0] = scan[0];
        top->scan[1] = scan[1];
        top->scan[2] = scan[2];
        top->start = 1;
        tick(top);
        top->start = 0;

        std::vector<uint32_t> rows;
        uint64_t cycles = 0, done_cycles = 0;
        uint64_t bound = (16ull * n_bytes + 16ull * n_blocks + 4096) * 100
                         / std::max<uint32_t>(1, std::min<uint32_t>(100, ready_percent));
        size_t pos = 0;
        Chance chance(seed);
        uint32_t status = 0xFFFFFFFFu, symbols = 0;
        bool finished = false;
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
            if (top->o___05Fvalid && ready) {
                push_words(rows, top->o___05Fpayload);
            }
            if (top->done) {
                finished = true;
                status = top->status;
                symbols = top->symbols;
                done_cycles = cycles + 1;  // clocks up to and including this one, as the entropy harness counts
            }
            rise(top);
            ++cycles;
            if (in_fire) pos += n;
            if (finished && status != 0) {  // drop what a faulty scan left in flight
                reset(top, 1);
                break;
            }
            if (finished && rows.size() >= (size_t)kRowWords * (8 / kLanes) * n_blocks) break;
            if (cycles > bound) {
                status = 0xFFFFFFFFu;
                reset(top, 1);  // recover for the next job
                break;
            }
        }
        uint32_t n_rows = (uint32_t)(rows.size() / kRowWords);
        write_value(status);
        write_value(symbols);
        write_value(done_cycles);
        write_value(cycles);
        write_value(n_rows);
        write_value(kRowWords);
        fwrite(rows.data(), 4, rows.size(), stdout);
        fflush(stdout);
    }
    top->final();
    delete top;
    return 0;
}
