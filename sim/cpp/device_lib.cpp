// The simulated decoder device: a Verilator model of the exported top (hw/device.py) with
// host memory modelled on its AXI4 master and the host's register accesses on its
// AXI4-Lite slave. Built as a shared library and loaded by dlbooster.sim.device (ctypes);
// every clock runs here, none in Python.
//
// Memory: MEM_BYTES of lazily-backed anonymous memory at device address MEM_BASE (above
// 4 GiB, so the 64-bit address path is exercised). Each 4 KiB page carries a permission
// (none, read, read-write) set by the host; an access outside its permission is counted
// as a violation (a write is not performed; a read returns zeros) and answered SLVERR.
//
// Memory port behaviour (dlb_set_port): ARREADY/AWREADY/WREADY/RVALID/BVALID each offered in
// `ready_percent` of clocks (seeded xorshift), read data `latency` clocks after the
// request, read bursts answered in order, and stalls: the port can stop answering reads
// or writes altogether (for the watchdog tests).
//
// Clocking: DLB_ONE_EVALUATION (from the build, dlbooster.sim.device; 1 unless given)
// selects how a clock is simulated. 1: one evaluation per clock, on the Verilog that
// one_evaluation_per_clock rewrote (below, at DLB_GATES). 0: the ordinary way, for the
// flattened Verilog as it is, where that rewriting did not know its form: ap_clk rises,
// then falls, with Verilator's full evaluation after each edge, and no gate ports (the
// gates are the design's own logic, their enables sampled on the falling edge).
#ifndef DLB_ONE_EVALUATION
#define DLB_ONE_EVALUATION 1
#endif
#if !DLB_ONE_EVALUATION && DLB_GATES
#error "a build without one evaluation per clock has no gate ports (DLB_GATES=0)"
#endif

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

#include "Vdlbooster_decoder.h"
#include "Vdlbooster_decoder___024root.h"
#include "verilated.h"

// The model's evaluation itself, which Vdlbooster_decoder::eval() runs and then tidies up
// after: it flushes Verilator's cross-thread message queue (a mutex and a thread-local
// lookup) and its deferred deletions, about 175 instructions per call. This model has one
// thread and nothing to delete, and it is evaluated at least once per clock, so the harness
// calls the evaluation directly (4 % fewer instructions per clock with the two
// evaluations a clock took then, docs/benchmarks.md); the model's first evaluation (its
// initialisation) still goes through eval().
void Vdlbooster_decoder___024root___eval(Vdlbooster_decoder___024root *vlSelf);

static inline void evaluate(Vdlbooster_decoder *t) { Vdlbooster_decoder___024root___eval(t->rootp); }

// The three regions of Verilator's scheduler (Verilator 5, verilated_sched and
// V3Sched.cpp): the logic that follows the inputs (ico), the triggers of the clocks
// (act), and the registers and the logic after them (nba).
bool Vdlbooster_decoder___024root___eval_phase__ico(Vdlbooster_decoder___024root *vlSelf);
bool Vdlbooster_decoder___024root___eval_phase__act(Vdlbooster_decoder___024root *vlSelf);
bool Vdlbooster_decoder___024root___eval_phase__nba(Vdlbooster_decoder___024root *vlSelf);

// A clock's evaluation: each region once. Verilator's _eval repeats a region until it
// triggers nothing more, which here always takes one more round of trigger evaluations
// that finds nothing: every clock of this model is a port (ap_clk and the gates' clocks,
// one_evaluation_per_clock allows no other), so the registers cannot trigger a clock, and
// no logic runs from an input back to an input. About 115 fewer instructions per clock
// (1.8 %, docs/benchmarks.md). With DLB_ONE_EVALUATION every clock (tick) is evaluated so
// (first_round true); dlb_check_gates runs the second round (false) after each clock of
// dlb_run and dlb_reset and counts the ones in which it found work. A Verilator that no
// longer generates these functions fails the library's load (an undefined symbol).
// Returns whether a region had work.
static inline bool run_regions(Vdlbooster_decoder *t, bool first_round) {
    auto *root = t->rootp;
    root->__VicoFirstIteration = first_round;
    bool work = Vdlbooster_decoder___024root___eval_phase__ico(root);
    work |= Vdlbooster_decoder___024root___eval_phase__act(root);
    work |= Vdlbooster_decoder___024root___eval_phase__nba(root);
    return work;
}

// Verilator renames the port `interrupt` (a reserved word to it) to __SYM__interrupt.

static const uint64_t MEM_BASE = 0x100000000ull;
static const uint64_t MEM_BYTES = 1ull << 32;
static const uint64_t PAGE = 4096;

static const int WORD_BYTES = sizeof(((Vdlbooster_decoder *)nullptr)->m_axi_gmem_rdata);
static const uint64_t ALL_STROBES = WORD_BYTES >= 64 ? ~0ull : (1ull << WORD_BYTES) - 1;

// Bus words as bytes, whatever C++ type Verilator gives the port (QData or VlWide).
template <class T> static inline void store_word(T &port, const uint8_t *src) { memcpy(&port, src, sizeof port); }
template <class T> static inline void load_word(uint8_t *dst, const T &port) { memcpy(dst, &port, sizeof port); }
template <std::size_t N> static inline void store_word(VlWide<N> &port, const uint8_t *src) {
    memcpy(port.data(), src, 4 * N);
}
template <std::size_t N> static inline void load_word(uint8_t *dst, const VlWide<N> &port) {
    memcpy(dst, port.data(), 4 * N);
}

struct Burst {
    uint32_t id;
    uint64_t addr;
    uint32_t beats;   // left
    uint64_t due;     // clock from which the first beat may be answered
    bool error;
};

// The bursts a channel has accepted and not finished, oldest first: at most MAX_BURSTS, as
// the address channel's ready is low while that many wait. A ring, not a std::deque,
// whose size() alone costs about 10 instructions in each of the clock's checks.
static const uint32_t MAX_BURSTS = 8;
struct Bursts {
    Burst slot[MAX_BURSTS];
    uint32_t head = 0, count = 0;
    bool empty() const { return count == 0; }
    bool full() const { return count == MAX_BURSTS; }
    Burst &front() { return slot[head]; }
    void pop_front() {
        head = (head + 1) % MAX_BURSTS;
        --count;
    }
    void push_back(const Burst &b) { slot[(head + count++) % MAX_BURSTS] = b; }
    void clear() { head = count = 0; }
};

struct Chance {
    uint32_t state = 1;
    bool operator()(uint32_t percent) {
        if (percent >= 100) return true;   // no gaps: nothing drawn (dlb_set_port reseeds)
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        return state % 100 < percent;
    }
};

struct Sim {
    // Its own context: several simulated devices may run at once, one per thread.
    VerilatedContext *ctx;
    Vdlbooster_decoder *top;
    uint8_t *mem;
    std::vector<uint8_t> perm;   // per page: 0 none, 1 read, 3 read-write
    Bursts reads, writes;
    std::deque<std::pair<uint32_t, bool>> responses;   // B: id, error
    uint64_t clocks = 0, violations = 0, first_violation = 0, read_beats = 0, write_beats = 0;
    uint32_t ready_percent = 100, latency = 0;
    bool stall_reads = false, stall_writes = false;
    bool r_offer = false, b_offer = false;   // offered in this clock: set by drive(), read by tick()
    bool check_early = false;                // dlb_check_gates
    uint64_t early_reads = 0, unfinished = 0;
    bool test_unevaluated_edge = false;       // dlb_test_unevaluated_edge
    Chance chance;
    uint8_t word[WORD_BYTES];
};

// Whether [addr, addr + n) lies in the modelled memory; no sum can wrap at the top of the
// 64-bit address space, where the device may be sent.
static bool in_memory(uint64_t addr, uint64_t n) {
    return n != 0 && addr >= MEM_BASE && addr - MEM_BASE <= MEM_BYTES && n <= MEM_BYTES - (addr - MEM_BASE);
}

// Whether [addr, addr + n) lies in memory with permission `need`.
static bool allowed(Sim *s, uint64_t addr, uint64_t n, uint8_t need) {
    if (!in_memory(addr, n)) return false;
    for (uint64_t p = (addr - MEM_BASE) / PAGE; p <= (addr - MEM_BASE + n - 1) / PAGE; ++p)
        if ((s->perm[p] & need) != need) return false;
    return true;
}

static void violation(Sim *s, uint64_t addr) {
    if (!s->violations++) s->first_violation = addr;
}

// With DLB_ONE_EVALUATION, a clock is one evaluation of the model
// (one_evaluation_per_clock): every register takes both edges of ap_clk, which toggles once
// per clock, and each clock gate's clock is a port (gate_clk) toggled with it in the
// clocks whose gate_open was high before the clock's inputs were applied. gate_open and the
// AXI4 master's outputs must therefore not depend combinationally on any input (the gates'
// enables depend on registers only, hw/gating.py); dlb_check_gates counts the clocks where
// they did. Wherever the harness changes an input other than the memory side's (ap_rst_n,
// the AXI4-Lite requests), it evaluates once without a clock edge (settle) before the next
// clock.

// DLB_GATES, from the build (dlbooster.sim.device), is the number of clock gates the
// rewriting found: the model has gate_open and gate_clk ports when it is not 0.
template <class T> static inline void toggle(T &clk, const T &open) { clk ^= open; }
template <std::size_t N> static inline void toggle(VlWide<N> &clk, const VlWide<N> &open) {
    for (std::size_t i = 0; i < N; ++i) clk[i] ^= open[i];
}
template <class T> static inline bool differs(const T &a, const T &b) { return a != b; }
template <std::size_t N> static inline bool differs(const VlWide<N> &a, const VlWide<N> &b) {
    return memcmp(a.data(), b.data(), 4 * N) != 0;
}

// The C++ type of gate_open (CData .. QData, or VlWide for more than 64 gates).
#if DLB_GATES
using GateWord = std::remove_reference_t<decltype(std::declval<Vdlbooster_decoder &>().gate_open)>;
#else
using GateWord = uint8_t;
#endif

static inline void open_gates(Vdlbooster_decoder *t) {
#if DLB_GATES
    toggle(t->gate_clk, t->gate_open);
#else
    (void)t;
#endif
}

// What a clock's evaluation reads before the clock's inputs settle: the gates' enables and
// the master's outputs that tick() samples.
struct Early {
    uint8_t valids;
    uint64_t araddr, awaddr;
    uint32_t ids_lens, wlast;
    uint64_t wstrb;
    uint8_t wdata[WORD_BYTES];
    GateWord open{};
    explicit Early(Vdlbooster_decoder *t)
        : valids(t->m_axi_gmem_arvalid | t->m_axi_gmem_awvalid << 1 | t->m_axi_gmem_wvalid << 2 |
                 t->m_axi_gmem_rready << 3 | t->m_axi_gmem_bready << 4),
          araddr(t->m_axi_gmem_araddr), awaddr(t->m_axi_gmem_awaddr),
          ids_lens(t->m_axi_gmem_arid | t->m_axi_gmem_awid << 8 | (uint32_t)t->m_axi_gmem_arlen << 16 |
                   (uint32_t)t->m_axi_gmem_awlen << 24),
          wlast(t->m_axi_gmem_wlast), wstrb(t->m_axi_gmem_wstrb) {
        load_word(wdata, t->m_axi_gmem_wdata);
#if DLB_GATES
        open = t->gate_open;
#endif
    }
    bool operator!=(const Early &o) const {
        return valids != o.valids || araddr != o.araddr || awaddr != o.awaddr || ids_lens != o.ids_lens ||
               wlast != o.wlast || wstrb != o.wstrb || memcmp(wdata, o.wdata, WORD_BYTES) != 0 ||
               differs(open, o.open);
    }
};

// The memory side's inputs of the next clock.
static inline void drive(Sim *s) {
    auto *t = s->top;
    Burst *rb = s->reads.empty() ? nullptr : &s->reads.front();
    bool r_offer = rb && !s->stall_reads && s->clocks >= rb->due && s->chance(s->ready_percent);
    bool r_error = false;
    if (r_offer) {
        r_error = !allowed(s, rb->addr, WORD_BYTES, 1);
        if (r_error) {
            violation(s, rb->addr);
            memset(s->word, 0, WORD_BYTES);
        } else {
            memcpy(s->word, s->mem + (rb->addr - MEM_BASE), WORD_BYTES);
        }
        store_word(t->m_axi_gmem_rdata, s->word);
        t->m_axi_gmem_rid = rb->id;
        t->m_axi_gmem_rlast = rb->beats == 1;
        t->m_axi_gmem_rresp = r_error ? 2 : 0;
    }
    t->m_axi_gmem_rvalid = r_offer;
    t->m_axi_gmem_arready = !s->stall_reads && !s->reads.full() && s->chance(s->ready_percent);
    t->m_axi_gmem_awready = !s->stall_writes && !s->writes.full() && s->chance(s->ready_percent);
    t->m_axi_gmem_wready = !s->stall_writes && !s->writes.empty() && s->chance(s->ready_percent);
    bool b_offer = !s->responses.empty() && !s->stall_writes && s->chance(s->ready_percent);
    t->m_axi_gmem_bvalid = b_offer;
    if (b_offer) {
        t->m_axi_gmem_bid = s->responses.front().first;
        t->m_axi_gmem_bresp = s->responses.front().second ? 2 : 0;
    }
    s->r_offer = r_offer;
    s->b_offer = b_offer;
}

// Evaluation without a clock edge: outputs that follow inputs combinationally (the AXI4-Lite
// readies, and every valid while ap_rst_n is low) settle.
static void settle(Sim *s) { evaluate(s->top); }

// The memory side's inputs and a settled evaluation: for register accesses, which sample
// the AXI4-Lite readies.
static void drive_and_settle(Sim *s) {
    drive(s);
    settle(s);
}

// The clock itself: sample the handshakes, evaluate, update the memory side.
static inline void tick(Sim *s) {
    auto *t = s->top;
    Burst *rb = s->reads.empty() ? nullptr : &s->reads.front();
    bool r_offer = s->r_offer, b_offer = s->b_offer;
    // Nothing is transferred while the device is held in reset.
    bool live = t->ap_rst_n;
    bool ar = live && t->m_axi_gmem_arvalid && t->m_axi_gmem_arready;
    bool aw = live && t->m_axi_gmem_awvalid && t->m_axi_gmem_awready;
    bool w = live && t->m_axi_gmem_wvalid && t->m_axi_gmem_wready;
    bool r = live && r_offer && t->m_axi_gmem_rready;
    bool b = live && b_offer && t->m_axi_gmem_bready;
    Burst ar_burst, aw_burst;   // set where used: zeroing both costs 8 instructions a clock
    if (ar) ar_burst = {t->m_axi_gmem_arid, t->m_axi_gmem_araddr, (uint32_t)t->m_axi_gmem_arlen + 1u,
                        s->clocks + s->latency, false};
    if (aw) aw_burst = {t->m_axi_gmem_awid, t->m_axi_gmem_awaddr, (uint32_t)t->m_axi_gmem_awlen + 1u, 0, false};
    if (w) {
        Burst &wb = s->writes.front();
        load_word(s->word, t->m_axi_gmem_wdata);
        uint64_t strb = t->m_axi_gmem_wstrb;
        // One permission check for a beat inside writable memory; byte by byte otherwise,
        // so the first byte out of bounds is the one reported.
        bool whole = allowed(s, wb.addr, WORD_BYTES, 3);
        if (whole && strb == ALL_STROBES) {
            memcpy(s->mem + (wb.addr - MEM_BASE), s->word, WORD_BYTES);   // most beats
        } else {
            for (int i = 0; i < WORD_BYTES; ++i) {
                if (!((strb >> i) & 1)) continue;
                uint64_t a = wb.addr + i;
                if (whole || allowed(s, a, 1, 3)) {
                    s->mem[a - MEM_BASE] = s->word[i];
                } else {
                    violation(s, a);
                    wb.error = true;
                }
            }
        }
        ++s->write_beats;
        wb.addr += WORD_BYTES;
        bool last = t->m_axi_gmem_wlast;
        if (--wb.beats == 0 || last) {
            if ((wb.beats == 0) != last) violation(s, wb.addr);   // WLAST on the wrong beat
            s->responses.emplace_back(wb.id, wb.error);
            s->writes.pop_front();
        }
    }
#if DLB_ONE_EVALUATION
    open_gates(t);
    t->ap_clk ^= 1;
    run_regions(t, true);
#else
    // ap_clk is low between clocks: the registers take the rising edge, the gates'
    // enable registers the falling one.
    t->ap_clk = 1;
    evaluate(t);
    t->ap_clk = 0;
    evaluate(t);
#endif
    ++s->clocks;
    if (r) {
        ++s->read_beats;
        rb->addr += WORD_BYTES;
        if (--rb->beats == 0) s->reads.pop_front();
    }
    if (b) s->responses.pop_front();
    if (ar) s->reads.push_back(ar_burst);
    if (aw) s->writes.push_back(aw_burst);
}

// A clock under dlb_check_gates: a full evaluation before the clock (after its memory-side
// inputs), counted when it changes a gate's enable or a master output, and the second
// round of the regions after it, counted when it finds work. Without DLB_ONE_EVALUATION
// tick() still samples the master's outputs before the clock's inputs, so early reads
// still count, but every edge has had Verilator's full evaluation: no second round, and
// unfinished stays 0.
static void checked_step(Sim *s) {
    Early before(s->top);
    settle(s);
    if (before != Early(s->top)) ++s->early_reads;
    tick(s);
#if DLB_ONE_EVALUATION
    if (s->test_unevaluated_edge) {
        s->test_unevaluated_edge = false;
        s->top->ap_clk ^= 1;
    }
    if (run_regions(s->top, false)) ++s->unfinished;
#endif
}

// One clock. A function of its own (not inlined): docs/benchmarks.md counts the
// instructions executed inside it.
__attribute__((noinline)) static void step(Sim *s) {
    drive(s);
    if (s->check_early)
        checked_step(s);
    else
        tick(s);
}

extern "C" {

void *dlb_open() {
    auto *s = new Sim;
    s->ctx = new VerilatedContext;
    s->top = new Vdlbooster_decoder{s->ctx};
    void *m = mmap(nullptr, MEM_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        delete s->top;
        delete s->ctx;
        delete s;
        return nullptr;
    }
    s->mem = (uint8_t *)m;
    s->perm.assign(MEM_BYTES / PAGE, 0);
    auto *t = s->top;
    t->s_axi_control_awvalid = t->s_axi_control_wvalid = t->s_axi_control_arvalid = 0;
    t->s_axi_control_bready = t->s_axi_control_rready = 0;
    t->s_axi_control_wstrb = 0xF;
    t->ap_clk = 0;
    t->ap_rst_n = 0;
    t->eval();
    for (int i = 0; i < 4; ++i) step(s);
    t->ap_rst_n = 1;
    settle(s);
    return s;
}

void dlb_close(void *h) {
    auto *s = (Sim *)h;
    s->top->final();
    delete s->top;
    delete s->ctx;
    munmap(s->mem, MEM_BYTES);
    delete s;
}

uint8_t *dlb_memory(void *h) { return ((Sim *)h)->mem; }
uint64_t dlb_memory_base() { return MEM_BASE; }
uint64_t dlb_memory_bytes() { return MEM_BYTES; }
uint32_t dlb_word_bytes() { return WORD_BYTES; }

// Permission of the pages covering [addr, addr + n): 0 none, 1 read, 3 read-write.
int dlb_map(void *h, uint64_t addr, uint64_t n, uint32_t perm) {
    auto *s = (Sim *)h;
    if (!in_memory(addr, n)) return -1;
    for (uint64_t p = (addr - MEM_BASE) / PAGE; p <= (addr - MEM_BASE + n - 1) / PAGE; ++p) s->perm[p] = perm;
    return 0;
}

void dlb_set_port(void *h, uint32_t ready_percent, uint32_t latency, uint32_t seed, int stall_reads,
                  int stall_writes) {
    auto *s = (Sim *)h;
    s->ready_percent = ready_percent;
    s->latency = latency;
    s->chance.state = seed ? seed : 1;
    s->stall_reads = stall_reads;
    s->stall_writes = stall_writes;
}

// ap_rst_n low for `clocks` clocks; the memory side forgets every transaction in flight.
void dlb_reset(void *h, uint32_t clocks) {
    auto *s = (Sim *)h;
    s->top->ap_rst_n = 0;
    settle(s);
    for (uint32_t i = 0; i < clocks; ++i) step(s);
    s->reads.clear();
    s->writes.clear();
    s->responses.clear();
    s->top->ap_rst_n = 1;
    settle(s);
}

// A register access the slave did not answer within 1000 clocks is withdrawn: its valids
// drop, as a host's master gives up on a request (and then resets the device). Left high,
// the request would be taken once the device answers again, after a reset: a write
// landing late, or a read whose response nobody takes, which stops the slave from
// accepting another read. A ready of a response phase stays high, so that a response
// coming late is taken and dropped; the next access lowers it when it ends.
static uint32_t abandon(Sim *s) {
    auto *t = s->top;
    t->s_axi_control_awvalid = t->s_axi_control_wvalid = t->s_axi_control_arvalid = 0;
    settle(s);
    return 0;
}

// One AXI4-Lite write; returns the clocks it took, or 0 if the slave did not answer.
uint32_t dlb_write32(void *h, uint32_t addr, uint32_t value) {
    auto *s = (Sim *)h;
    auto *t = s->top;
    uint64_t start = s->clocks;
    t->s_axi_control_awaddr = addr;
    t->s_axi_control_wdata = value;
    t->s_axi_control_awvalid = t->s_axi_control_wvalid = 1;
    bool aw_done = false, w_done = false;
    while (!(aw_done && w_done)) {
        // The readies are combinational on the valids: sampled once the valids settle.
        drive_and_settle(s);
        bool aw = t->s_axi_control_awready, w = t->s_axi_control_wready;
        tick(s);
        if (aw) { aw_done = true; t->s_axi_control_awvalid = 0; }
        if (w) { w_done = true; t->s_axi_control_wvalid = 0; }
        if (s->clocks - start > 1000) return abandon(s);
    }
    t->s_axi_control_bready = 1;
    for (;;) {
        drive_and_settle(s);
        bool b = t->s_axi_control_bvalid;
        tick(s);
        if (b) break;
        if (s->clocks - start > 1000) return abandon(s);
    }
    t->s_axi_control_bready = 0;
    settle(s);
    return (uint32_t)(s->clocks - start);
}

// One AXI4-Lite read; *ok is set to 0 if the slave did not answer.
uint32_t dlb_read32(void *h, uint32_t addr, int *ok) {
    auto *s = (Sim *)h;
    auto *t = s->top;
    uint64_t start = s->clocks;
    *ok = 0;
    t->s_axi_control_araddr = addr;
    t->s_axi_control_arvalid = 1;
    for (;;) {
        drive_and_settle(s);
        bool ar = t->s_axi_control_arready;
        tick(s);
        if (ar) break;
        if (s->clocks - start > 1000) return abandon(s);
    }
    t->s_axi_control_arvalid = 0;
    t->s_axi_control_rready = 1;
    uint32_t value = 0;
    for (;;) {
        drive_and_settle(s);
        bool r = t->s_axi_control_rvalid;
        value = t->s_axi_control_rdata;
        tick(s);
        if (r) break;
        if (s->clocks - start > 1000) return abandon(s);
    }
    t->s_axi_control_rready = 0;
    settle(s);
    *ok = 1;
    return value;
}

// Runs up to `max_clocks` clocks, stopping early (after the clock where it rose) when
// `until_interrupt` and the interrupt output is high. Returns the clocks run.
uint64_t dlb_run(void *h, uint64_t max_clocks, int until_interrupt) {
    auto *s = (Sim *)h;
    uint64_t start = s->clocks;
    while (s->clocks - start < max_clocks) {
        if (until_interrupt && s->top->__SYM__interrupt) break;
        step(s);
    }
    return s->clocks - start;
}

int dlb_interrupt(void *h) { return ((Sim *)h)->top->__SYM__interrupt; }

// 1 where a clock is one evaluation (DLB_ONE_EVALUATION), 0 where it is two edges.
int dlb_one_evaluation() { return DLB_ONE_EVALUATION; }

// clocks, violations, first violation address, read beats, write beats, early reads,
// unfinished clocks.
void dlb_counters(void *h, uint64_t *out) {
    auto *s = (Sim *)h;
    out[0] = s->clocks;
    out[1] = s->violations;
    out[2] = s->first_violation;
    out[3] = s->read_beats;
    out[4] = s->write_beats;
    out[5] = s->early_reads;
    out[6] = s->unfinished;
}

// Check every clock run by dlb_run and dlb_reset: evaluate once more after the clock's
// memory-side inputs are applied and count the clocks in which a gate's enable or a
// handshake output of the master changed (early_reads: the clock's one evaluation read it
// before the inputs, a design fault); and after the clock, run the second round of the
// scheduler's regions that Verilator's own evaluation would, counting the clocks in which
// it found work (unfinished; always 0 without DLB_ONE_EVALUATION, checked_step). Doubles
// the evaluations.
void dlb_check_gates(void *h, int on) {
    auto *s = (Sim *)h;
    s->check_early = on;
    s->test_unevaluated_edge = false;
}

// Test instrument: drive ap_rst_n without the evaluation that settles what it forces (every
// valid of the master low while it is low), so that the next clock reads those valids
// early; the tests show with it that dlb_check_gates counts such a clock.
void dlb_test_unsettled_reset(void *h, int level) { ((Sim *)h)->top->ap_rst_n = level; }

// Test instrument: the next clock checked (dlb_check_gates on; turning it on or off
// forgets the request) leaves an edge of ap_clk to the next evaluation,
// as a model whose registers drove a clock would leave work for a second round of the
// scheduler; the tests show with it that dlb_check_gates counts such a clock. Without
// DLB_ONE_EVALUATION there is no such round, and the request does nothing.
void dlb_test_unevaluated_edge(void *h) { ((Sim *)h)->test_unevaluated_edge = true; }
}
