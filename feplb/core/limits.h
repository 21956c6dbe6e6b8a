// The input limits of feplb's file formats, defined once: every reader, the trace generator, the
// CLI's flags and the docs (trace-format.md, placement.md) take their bounds from here.
#pragma once

#include <cstdint>

namespace feplb::limits {

// Shapes.
inline constexpr int64_t kMaxRanks = int64_t{1} << 14;          // R, the EP group
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;        // E, experts per layer
inline constexpr int64_t kMaxTokensPerRank = int64_t{1} << 32;  // S, tokens per rank per step
inline constexpr int64_t kMaxExpertDim = int64_t{1} << 20;      // an expert's hidden or ffn size
inline constexpr int64_t kMaxStepId = (int64_t{1} << 31) - 1;   // a step or layer id

// How much a file may hold: every count of a trace (R x E per step, all steps), every
// (layer, expert) entry of a placement or prior, every point of a GEMM table. A trace's counts
// are int64 in memory: at most 1 GiB.
inline constexpr int64_t kMaxTraceCounts = int64_t{1} << 27;
inline constexpr int64_t kMaxPlacementEntries = int64_t{1} << 24;
inline constexpr int64_t kMaxPriorEntries = int64_t{1} << 24;
inline constexpr int64_t kMaxGemmTablePoints = int64_t{1} << 16;
// An expert GEMM time in a GEMM table (ms): a larger one is no measurement, and the planner's
// sums of many such times must stay finite.
inline constexpr double kMaxGemmMs = 1e6;

// JSON documents nest a few levels; deeper ones are refused while parsing.
inline constexpr int kMaxJsonDepth = 64;
// Free-form parts of a document (a trace's "generator", a placement's "history", the header's
// other members): at most this much text each.
inline constexpr int64_t kMaxFreeFormBytes = int64_t{1} << 20;

// File sizes follow from the above: each number may take this many bytes of text (a 10-digit
// count or a 17-digit float, a separator and indentation), plus the header and free-form parts.
inline constexpr int64_t kBytesPerCount = 16;
inline constexpr int64_t kBytesPerFloat = 32;
inline constexpr int64_t kHeaderBytes = 4 * kMaxFreeFormBytes;
inline constexpr int64_t kMaxTraceBytes = kMaxTraceCounts * kBytesPerCount + kHeaderBytes;
inline constexpr int64_t kMaxPlacementBytes = kMaxPlacementEntries * kBytesPerCount + kHeaderBytes;
inline constexpr int64_t kMaxPriorBytes = kMaxPriorEntries * kBytesPerFloat + kHeaderBytes;
inline constexpr int64_t kMaxGemmTableBytes =
    2 * kMaxGemmTablePoints * kBytesPerFloat + kHeaderBytes;

}  // namespace feplb::limits
