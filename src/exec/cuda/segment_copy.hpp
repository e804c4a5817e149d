#pragma once
// The exchange as a plan runner: one grid copies a range of a plan's segments, each to its
// destination rank, raises the flags the segments name there, and ends once this rank's flags
// that the next phase waits for are raised, so that the kernels after it in stream order read
// what arrived. It decides nothing: which rows go where, and what signals what, are the plan's.
// (Copy rows now; COMET's copy-and-reduce is the next segment kind.)
//
// How it runs a plan:
//  - CTAs in groups of ctas_per_peer, a group per destination rank, this rank's next ranks first
//    and itself last, so that at any moment the groups write to different peers (every link
//    busy) and the local copy overlaps. A group's warps take the rows of its segments in turn.
//    A local segment that waits for rank q (a placement of the rows q sent) runs in q's group,
//    after that group's sends to q, whose flags it raises before it waits: the placements
//    spread over every group, and two ranks placing each other's rows never wait on each other.
//  - A segment's flag is a counter in the destination's region (EpRegionLayout::segment_flags),
//    or a GIN signal for a peer on another node. Every CTA of a group raises it once for each of
//    the group's segments that names it, after all its rows are stored, so a segment is whole at
//    ctas_per_peer raises; the counters only grow (no reset, so graph replays need none), and a
//    plan's wait for count c in step e waits for e * c * ctas_per_peer.
//  - Gathers: with the plan's gather table on the device (SegmentCopyArgs::gather_rows: a
//    dispatch once per destination rank), a gathered segment's row i is its source buffer's row
//    gather_rows[gather_begin + i], as on the CPU engine. Without one, only Input is gathered, and
//    from the permuted copy the layout wrote: row gather_begin + i (a rank's gather table starts
//    with its permuted order), so that every segment reads contiguous rows (GIN puts need that).
//  - With serial_sends, a send to another rank first waits (bounded) until the plan's previous
//    send has landed, and is then paced to the whole link, not a share.
//  - Waits for this rank's own flags are met by stream order (the grid runs after every task
//    before its range on this rank), except those a kernel beside it raises (`own_flags`: comet's
//    GEMM1 counts the tiles of each column split there). Those, and a wait for another rank's
//    flag (a placement waiting for its source's rows to arrive), every CTA of the group waits
//    for, bounded, before it copies.
//  - A plan it cannot run (an overflowed table, a buffer or flag the exchange does not hold, rows
//    past a buffer's room) is recorded as WaitState::PlanInvalid, naming the segment; nothing of
//    that segment is copied.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/cuda/ep_exchange.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

// One of the plan's row buffers as the exchange holds it.
struct SegmentBuffer {
  const std::byte* local = nullptr;  // this rank's rows, for segments that read it (null: not read)
  std::size_t region_offset = 0;     // where it sits in every rank's region, for segments that write
                                     // it at a peer (0: not written)
  std::int64_t rows = 0;             // its room in rows, on either side
};

// The tasks whose waits end the grid, so that the kernels after it in stream order read what
// arrived.
enum class SegmentDrain : std::uint8_t {
  GemmTiles,     // the dispatch: GEMM0 reads the rows once they are in (the first tile's waits,
                 // which every GEMM0 tile of sequential and tile_signal shares)
  CombineTasks,  // the combine send: the top-k sums read the returned rows (every combine
                 // task's waits: comet's differ from split to split)
  None,          // nothing: the tasks that read the rows wait for them themselves (comet's GEMM0
                 // tiles, in the GEMM that runs beside the dispatch)
};

struct SegmentCopyArgs {
  EpRegionLayout layout;
  const std::uint64_t* epoch = nullptr;  // the step (launch_ep_begin_step ran before, in stream order)
  const PlanTables* plan = nullptr;      // device: the step's plan
  int first_segment = 0;                 // the range [first_segment, first_segment + segment_count),
  int segment_count = 0;                 // clipped to the plan's segments
  SegmentBuffer buffers[kBufferCount];   // indexed by BufferId
  const int* gather_rows = nullptr;      // the plan's gather table (this rank's region), or null (see above)
  std::int64_t gather_room = 0;          // its entries
  int hidden = 0;
  int ctas_per_peer = 1;
  SegmentDrain drain = SegmentDrain::GemmTiles;
  // The sends to other ranks one after another in the plan's order, each with the whole link: a
  // send starts once the plan's previous send has landed (its flag raised at its destination by
  // every CTA of its group), so that the destinations receive in that order (comet's ring, whose
  // GEMM0 works through the first sources' rows while the next arrive) instead of all at the end.
  bool serial_sends = false;
  // This rank's flags [own_flag_begin, own_flag_begin + own_flag_count) as a kernel running beside
  // the copy raises them: own_flags[f - own_flag_begin] counts flag f's raises this step (device;
  // the GEMM's u32 flags, reset before it starts). Null: every own flag is met by stream order.
  const unsigned* own_flags = nullptr;
  std::uint32_t own_flag_begin = 0, own_flag_count = 0;
  // > 0: the grid is this many CTAs serving every destination between them (ctas_per_peer must be
  // 1, every peer load/store), not a group of ctas_per_peer CTAs per destination. comet's exchange
  // runs beside the GEMMs, and each of its CTAs costs them an SM (a GEMM CTA needs a whole SM, and
  // the block scheduler may give every copy CTA an SM of its own), so it runs on a few CTAs
  // whatever the world:
  //  - with serial_sends, CTA 0 sends to every other rank in the plan's order, and CTAs 1.. place
  //    (this rank's own rows, then the sources in the order they land, dealt round-robin), so that
  //    placing one source never holds up the send to the next; one CTA does all in plan order;
  //  - without, destination group g (the next ranks first, this rank last) runs on CTA
  //    g % packed_ctas, and the CTAs sending to other ranks share the link.
  // A CTA raises a flag as soon as its run of segments naming it ends, so that a destination
  // learns of its rows when they are stored, not at the end of the CTA's list.
  int packed_ctas = 0;
  bool silent = false;  // fault injection: this rank sends nothing (tests)
};

void launch_segment_copy(cudaStream_t stream, const DeviceTransport& transport, const SegmentCopyArgs& args);

// How many of the grid's CTAs an SM holds: how many ranks' exchanges can wait for each other
// on one GPU at once.
int segment_copy_ctas_per_sm();

}  // namespace tilemoe::cuda
