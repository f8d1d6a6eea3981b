// Shared pieces of the Verilator harnesses (sim/cpp/*_main.cpp): stdin/stdout framing,
// clocking and reset, the InputBeat of a byte stream, a seeded valid/ready pattern.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

static inline bool read_all(void *dst, size_t n) { return fread(dst, 1, n, stdin) == n; }

template <class T> static inline void write_value(const T &value) { fwrite(&value, sizeof value, 1, stdout); }

// A clock cycle is settle() (clock low: the inputs set since the last edge propagate;
// outputs may be read) then rise() (the rising edge): two evaluations per cycle.
template <class Top> static inline void settle(Top *top) {
    top->clk = 0;
    top->eval();
}

template <class Top> static inline void rise(Top *top) {
    top->clk = 1;
    top->eval();
}

template <class Top> static inline void tick(Top *top) {
    settle(top);
    rise(top);
}

// Two clocks with rst high (power-up), or one (recovery between jobs).
template <class Top> static inline void reset(Top *top, int clocks) {
    top->rst = 1;
    top->eval();
    for (int i = 0; i < clocks; ++i) tick(top);
    top->rst = 0;
}

// The InputBeat (data 32, n 3, last 1) holding bytes[pos..pos+4); n = 0 past the end.
struct InputChunk {
    uint64_t payload;
    uint32_t n;
};

static inline InputChunk input_chunk(const std::vector<uint8_t> &bytes, size_t pos) {
    uint32_t n = pos < bytes.size() ? (uint32_t)std::min<size_t>(4, bytes.size() - pos) : 0;
    uint64_t data = 0;
    for (uint32_t j = 0; j < n; ++j) data |= (uint64_t)bytes[pos + j] << (8 * j);
    bool last = n && pos + n >= bytes.size();
    return {data | ((uint64_t)n << 32) | ((uint64_t)last << 35), n};
}

// xorshift32: true in about `percent` of the calls (always at 100).
struct Chance {
    uint32_t state;
    explicit Chance(uint32_t seed) : state(seed ? seed : 1) {}
    bool operator()(uint32_t percent) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        return percent >= 100 || state % 100 < percent;
    }
};

// Appends the 32-bit words of a wide Verilator port.
template <class Wide> static inline void push_words(std::vector<uint32_t> &out, const Wide &port) {
    for (size_t w = 0; w < sizeof port / 4; ++w) out.push_back(port[w]);
}
