// The compile-time constants of the CUDA kernel families other than dense attention (its tiles:
// AttnCudaTraits in attn_dense.cuh), one traits struct each, and the shape limits they put on the
// ops. The families' plans (cuda::plan, in each family's .cu) read the limits from here and are the
// only place they are enforced: dispatch asks the plan before any kernel runs, and the launcher
// runs the variant it names. Plain C++ (no device code), so that plans and kernels share it.
#pragma once
#include <cstdint>

namespace hmla::cuda {

// Every kernel's mma.sync tiles are 16 x 8 x 16 (bf16): operand widths come in multiples of 16.
inline constexpr int kMmaK = 16;

// Sparse latent MQA (attn_sparse_fwd.cu, attn_sparse_bwd.cu). Forward: a block owns one query row, 16 x (at most
// kFwdHeadWarps) heads and up to kFwdChunks value chunks of kFwdChunk columns (all of 512: the
// scores of a key tile are computed once per block, never per chunk), one warp per (16 heads,
// chunk); key tiles of kFwdBk gathered keys, whose scores the warps of a head subgroup split by
// 8-key column tiles into a shared f32 tile; kFwdBk 32 keeps Q, the key tile, the scores and the
// compacted list in 136 KB at 576 wide and 64 heads (fwd_smem_bytes, under the A100's 163 KB).
// The row's list is compacted into shared memory, hence kMaxKW. Backward: below.
struct SparseTraits {
  static constexpr int kPad = 8;
  static constexpr int kMaxKW = 4096;  // listed slots per row: the shared list of compact()
  static constexpr int kFwdHeadWarps = 4, kFwdChunks = 4, kFwdChunk = 128, kFwdBk = 32;
  static constexpr int kFwdWarps = kFwdHeadWarps * kFwdChunks;
  static constexpr int64_t kFwdMaxSmemBytes = 163 * 1024;
  static constexpr int64_t fwd_head_warps(int64_t H) { return H < 16 * kFwdHeadWarps ? (H + 15) / 16 : kFwdHeadWarps; }
  // Q [heads, Dqk + kPad] and the key tile [kFwdBk, Dqk + kPad] (bf16), the scores [heads, kFwdBk + kPad]
  // (f32), the compacted list [KW] (i32).
  static constexpr int64_t fwd_smem_bytes(int64_t H, int64_t Dqk, int64_t KW) {
    const int64_t heads = 16 * fwd_head_warps(H);
    return (heads + kFwdBk) * (Dqk + kPad) * 2 + heads * (kFwdBk + kPad) * 4 + KW * 4;
  }
  // Backward: one kernel per (row, group of kBwdHeads heads, chunk of kBwdDqChunk columns of Dqk)
  // walks the row's listed keys in tiles of kBwdKeys and computes S and dP once per tile over the full
  // Dqk / Dv: kBwdSplit warps per 16-head tile split that reduction (two halves of S, two of dP,
  // combined through shared memory); the same warps then split dq's columns (kBwdDqChunk / 8 /
  // kBwdSplit n-tiles of f32 accumulators each: 72 registers at 576) and the tile's dkv rows
  // (dS^T Q + P^T dO over the group's heads). 32 heads: Q, dO and the key tile at 576/512 plus a
  // 4096-slot list take 147 KB (bwd_smem_bytes), under an A100's 163 KB; 64 would not fit. One
  // chunk at every width up to 576, so S and dP are computed once per (row, head group, key tile).
  // The plan asks H to be a multiple of kHeadStep (the kernel masks a partial head tile, but no
  // case table row runs one on the device yet).
  static constexpr int kBwdWarps = 8;
  static constexpr int kBwdKeys = 32;
  static constexpr int kBwdHeads = 32;
  static constexpr int kBwdSplit = kBwdWarps / (kBwdHeads / 16);
  static constexpr int kBwdDqChunk = 576;
  static constexpr int kBwdPartLd = kBwdKeys + 4;  // f32 row stride of the partial S / dP tiles
  static constexpr int64_t kBwdMaxSmemBytes = 163 * 1024;
  static constexpr int kHeadStep = 16;
  static constexpr int64_t bwd_smem_bytes(int64_t Dqk, int64_t Dv, int64_t KW) {
    return 2 * ((kBwdHeads + kBwdKeys) * (Dqk + kPad) + kBwdHeads * (Dv + kPad) + 3 * kBwdKeys * (kBwdHeads + kPad)) +
           4 * (kBwdSplit * kBwdHeads * kBwdPartLd + KW);
  }
  // The backward's dkv workspace: f32 [rows, head groups, K + W, Dqk] for a chunk of rows; 512 MB
  // keeps a chunk of 2048-key rows at 576 wide (4.7 MB a row and head group) above a hundred rows
  // per head group (H / kBwdHeads groups: 4 at 128 heads, so 27 rows a chunk).
  static constexpr int64_t kBwdWorkspaceBytes = int64_t(512) << 20;
  static_assert(kHeadStep % kMmaK == 0, "mma tiles are 16 x 8 x 16");
  static_assert(kBwdHeads % 16 == 0 && kBwdSplit == 4, "4 warps per 16-head tile: two halves of S, two of dP");
  static_assert(kBwdDqChunk % (16 * kBwdSplit) == 0 && kBwdKeys == 32, "dq's column pairs split evenly; 2 key k-steps");
  static_assert(kFwdBk % 16 == 0 && kFwdChunks <= kFwdBk / 8 && kFwdChunk % 8 == 0,
                "a key tile's 8-key column tiles go round its chunks' warps; P V takes 16 keys a step");
};
static_assert(SparseTraits::bwd_smem_bytes(576, 512, SparseTraits::kMaxKW) + 1024 <= SparseTraits::kBwdMaxSmemBytes,
              "the sparse backward's tiles fit an A100 at 576/512");
static_assert(SparseTraits::fwd_smem_bytes(128, 576, SparseTraits::kMaxKW) <= SparseTraits::kFwdMaxSmemBytes,
              "the latent form at 576 wide fits the forward's shared memory at any listed length");

// DeepSeek-V4's attention core on the tensor cores (attn_compressed_mma.cu, attn_compressed_mma_bwd.cu;
// the SIMT kernels of attn_compressed.cu take the rest). MQA with one shared K = V head, so the
// heads are the mma rows (FlashMLA's layout): every head of a query row meets every key of the row.
// Forward: a block owns one query row, 16 x (at most kFwdHeadWarps) heads and all of d in chunks of
// kFwdChunk value columns, one warp per (16 heads, chunk), key tiles of kFwdBk gathered keys (the
// sparse forward's scheme, SparseTraits: the same reasons). Backward: a block per (query row, group
// of kBwdHeads heads), 8 warps, key tiles of kBwdKeys (the sparse backward's scheme): S and dP once
// per tile, dq in registers, the tile's key gradients summed over the group's heads into a workspace.
// Widths that are not multiples of 16 are zero-padded in the shared tiles (exact). kMaxD: d up to 512
// (V4's head width) keeps both passes' shared memory under an A100's 163 KB at kMaxK selected slots
// (the forward sorts a row's slots in shared memory: two int32 buffers of the next power of two).
struct CompressedMmaTraits {
  static constexpr int kPad = 8;
  static constexpr int64_t kMaxD = 512, kMaxK = 4096;
  static constexpr int kFwdHeadWarps = 4, kFwdChunks = 4, kFwdChunk = 128, kFwdBk = 32;
  static constexpr int kBwdWarps = 8, kBwdKeys = 32, kBwdHeads = 32, kBwdSplit = kBwdWarps / (kBwdHeads / 16);
  static constexpr int kBwdPartLd = kBwdKeys + 4;
  static constexpr int64_t kMaxSmemBytes = 163 * 1024;
  // The key gradients' workspace: f32 [rows, head groups, W + entries, d] for a chunk of rows.
  static constexpr int64_t kBwdWorkspaceBytes = int64_t(512) << 20;
  static constexpr int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
  static constexpr int64_t pow2_at_least(int64_t n) {
    int64_t r = 1;
    while (r < n) r *= 2;
    return r;
  }
  static constexpr int64_t fwd_head_warps(int64_t H) { return H < 16 * kFwdHeadWarps ? (H + 15) / 16 : kFwdHeadWarps; }
  // Q [heads, d'] and the key tile [kFwdBk, d'] (bf16, d' = pad16(d) + kPad), the scores [heads,
  // kFwdBk + kPad] (f32), the selected slots' sort buffers (2 x pow2(k) i32).
  static constexpr int64_t fwd_smem_bytes(int64_t H, int64_t d, int64_t k) {
    const int64_t heads = 16 * fwd_head_warps(H), ld = pad16(d) + kPad;
    return (heads + kFwdBk) * ld * 2 + heads * (kFwdBk + kPad) * 4 + (k > 0 ? 2 * pow2_at_least(k) * 4 : 0);
  }
  // Q, dO and the key tile (bf16 [32, d']), dS, dS^T, P^T (bf16 [32, 32 + kPad]), the partial S / dP.
  static constexpr int64_t bwd_smem_bytes(int64_t d) {
    const int64_t ld = pad16(d) + kPad;
    return 2 * ((2 * kBwdHeads + kBwdKeys) * ld + 3 * kBwdKeys * (kBwdHeads + kPad)) + 4 * kBwdSplit * kBwdHeads * kBwdPartLd;
  }
  // Whether both passes run on the tensor cores (else on the SIMT kernels).
  static constexpr bool mma(bool bf16, int64_t d, int64_t k) {
    return bf16 && d >= 1 && d <= kMaxD && k <= kMaxK && fwd_smem_bytes(64, d, k) <= kMaxSmemBytes &&
           bwd_smem_bytes(d) + 1024 <= kMaxSmemBytes;
  }
  static_assert(kBwdHeads % 16 == 0 && kBwdSplit == 4, "4 warps per 16-head tile: two halves of S, two of dP");
  static_assert(kBwdKeys == 32 && kFwdBk % 16 == 0 && kFwdChunks <= kFwdBk / 8, "the sparse kernels' tiles");
  static_assert(kMaxD <= kFwdChunks * kFwdChunk && kMaxD % (16 * kBwdSplit) == 0, "one block covers d");
};
static_assert(CompressedMmaTraits::mma(true, 512, 4096), "V4's head width and any top-k up to 4096 on the tensor cores");

// The indexer's scores and selection (indexer_topk.cu): blocks of kSelThreads sort a row's
// candidates in a shared buffer of kMaxK; the scores of a chunk of rows live in a workspace of
// kWorkspaceBytes; the score tiles are kRowsPerBlock query rows by kKeyTile keys.
struct TopkTraits {
  static constexpr int kSelThreads = 256;
  static constexpr int kMaxK = 2048;  // index_topk: DeepSeek-V3.2's and GLM-5's K
  static constexpr int64_t kWorkspaceBytes = int64_t(256) << 20;
  static constexpr int kRowsPerBlock = 4, kKeyTile = 64, kPad = 8;
  static constexpr int64_t kMaxSmemBytes = 163 * 1024;  // the scores' tiles: an A100's opt-in shared memory
  static_assert(kMaxK % kSelThreads == 0, "the sort's buffer is a whole number of passes of the block");
  static_assert(kKeyTile % kMmaK == 0, "mma tiles are 16 x 8 x 16");
};

// The fused indexer KLs (indexer_kl.cu), three paths (indexer_kl_simt.cu, indexer_kl_mma.cu,
// indexer_kl_sparse.cu). SIMT (f32 math; every input combination but bf16 qI/kI with bf16 q/k
// within the tensor-core limits, mma_dense and mma_sparse): kTile threads per block, one per key (rows pass) or row (keys pass); shared memory
// holds S [HI, kTile], dI [kTile], lC [H] (f32) and, in the sparse rows pass, the row's candidates
// (i32, K rounded up to a power of two): smem_bytes.
// Tensor cores (the dense KL on bf16 qI, kI, q, k: what the CUDA training step passes): tiles of
// kMmaRows query rows by kMmaKeys keys, one warp per 16 keys of a tile (kMmaWarps); a block owns a
// row tile (rows kernel) or a key tile (keys kernel). 16 rows is the smallest M of mma.sync: the
// attention's per-head keys (MHA) make query rows the only M the scores q . k can share. 64 keys
// give the keys kernel's dkI accumulator [64, DI] one warp of 16 keys each in registers, which is
// what bounds DI: kMmaMaxDI / 8 n-tiles of 4 f32 (64 registers at DI 128, DeepSeek-V3.2's and
// GLM-5's width). Widths that are not multiples of 16 are zero-padded in the shared tiles (exact:
// a zero channel adds 0 to every dot product). Shared memory: mma_smem_bytes.
// Both must fit the opt-in shared memory of the smallest target, an A100's 163 KB (Hopper has 227 KB).
struct IndexerKlTraits {
  static constexpr int kTile = 128;
  static constexpr int64_t kMaxHI = 256, kMaxH = 1024, kMaxK = 8192;
  static constexpr int64_t kMaxSmemBytes = 163 * 1024;
  static constexpr int kMmaRows = 16, kMmaKeys = 64, kMmaWarps = kMmaKeys / 16, kMmaThreads = 32 * kMmaWarps;
  static constexpr int64_t kMmaMaxDI = 128, kMmaPad = 8;
  static constexpr int64_t pow2_at_least(int64_t n) {
    int64_t r = 1;
    while (r < n) r *= 2;
    return r;
  }
  static constexpr int64_t smem_bytes(int64_t HI, int64_t H, int64_t cand) {
    return (HI * kTile + kTile + H) * 4 + cand * 4;
  }
  static constexpr int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
  static constexpr int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }
  // q, k tiles [kMmaRows + kMmaKeys, pad16(Dqk) + kMmaPad] and qI, kI tiles [.., pad16(DI) + kMmaPad]
  // (bf16); dI [kMmaRows, kMmaKeys] (bf16); lseC [H, kMmaRows], w [kMmaRows, HI], a reduction
  // scratch [kMmaRows, 4 kMmaWarps, 2] and four per-row values (f32); the relu masks, one ballot word
  // per (index head, warp, n-tile, accumulator register).
  static constexpr int64_t mma_smem_bytes(int64_t H, int64_t HI, int64_t Dqk, int64_t DI) {
    return align16((kMmaRows + kMmaKeys) * (pad16(Dqk) + kMmaPad) * 2) +
           align16((kMmaRows + kMmaKeys) * (pad16(DI) + kMmaPad) * 2) + align16(kMmaRows * kMmaKeys * 2) +
           align16(H * kMmaRows * 4) + align16(kMmaRows * HI * 4) + align16(kMmaRows * 4 * kMmaWarps * 2 * 4) +
           align16(kMmaRows * 4 * 4) + align16(HI * kMmaWarps * 8 * 4);
  }
  // Whether the dense KL runs on the tensor cores (else on the SIMT kernels).
  static constexpr bool mma_dense(bool bf16_inputs, int64_t H, int64_t HI, int64_t Dqk, int64_t DI) {
    return bf16_inputs && DI <= kMmaMaxDI && H <= kMaxH && HI <= kMaxHI &&
           mma_smem_bytes(H, HI, Dqk, DI) <= kMaxSmemBytes;
  }
  // The sparse KL on the tensor cores (indexer_kl_sparse.cu): a block of kSpWarps warps per query
  // row, the heads as the mma rows (kSpHeads attention heads of one kv head at a time, every index
  // head), the row's candidates gathered kSpKeys at a time. Index heads up to kSpMaxHI: G's f32
  // accumulators [HI, DI] stay in the block's registers (at most 16 x 128 per warp).
  static constexpr int kSpKeys = 32, kSpHeads = 64, kSpWarps = 8, kSpThreads = 32 * kSpWarps;
  static constexpr int64_t kSpMaxHI = 16 * kSpWarps;
  static constexpr int64_t kSpPart = 1024;  // f32 partials: [kSpHeads, 8 lanes' (m, l)] or [8 warps, HI]
  // The Q chunk or qI [rows, width + kMmaPad] and the gathered key tile (bf16); the dS tiles for G
  // [HI, kSpKeys + pad] and, transposed, for dkI (bf16); P and I (then dI) per candidate and the
  // candidates (f32, i32: K each); lseC [kSpHeads], w [HI], the partials, a block reduction (f32).
  static constexpr int64_t sp_smem_bytes(int64_t HI, int64_t Dqk, int64_t DI, int64_t K) {
    const int64_t ldq = pad16(Dqk) + kMmaPad, ldi = pad16(DI) + kMmaPad, HIp = pad16(HI);
    return align16((kSpHeads * ldq > HIp * ldi ? kSpHeads * ldq : HIp * ldi) * 2) +
           align16(kSpKeys * (ldq > ldi ? ldq : ldi) * 2) + align16(HIp * (kSpKeys + kMmaPad) * 2) +
           align16(kSpKeys * (HIp + kMmaPad) * 2) + 3 * align16(K * 4) + align16(kSpHeads * 4) + align16(HIp * 4) +
           align16(kSpPart * 4) + align16(kSpThreads * 4);
  }
  // The dkI contributions' workspace: f32 [rows, K, DI] for a chunk of rows (1 MB a row at K 2048,
  // DI 128, so 256 rows a chunk), reduced per key in row order (sparse_index.cuh).
  static constexpr int64_t kSpWorkspaceBytes = int64_t(256) << 20;
  // Whether the sparse KL runs on the tensor cores (else on the SIMT kernels).
  static constexpr bool mma_sparse(bool bf16_inputs, int64_t H, int64_t HI, int64_t Dqk, int64_t DI, int64_t K) {
    return bf16_inputs && DI <= kMmaMaxDI && HI <= kSpMaxHI && H <= kMaxH && K <= kMaxK &&
           sp_smem_bytes(HI, Dqk, DI, K) <= kMaxSmemBytes;
  }
};
// DeepSeek-V3.2's and GLM-5's indexer (HI 64 / 32, H 128 / 64, K 2048) fits with room.
static_assert(IndexerKlTraits::smem_bytes(64, 128, 2048) <= IndexerKlTraits::kMaxSmemBytes,
              "the reference geometries fit");
static_assert(IndexerKlTraits::mma_dense(true, 128, 64, 192, 128) && IndexerKlTraits::mma_dense(true, 64, 32, 256, 128),
              "the reference geometries run on the tensor cores");
// The sparse KL's: the latent form's 576-wide queries and keys, top-k 2048 (DeepSeek-V3.2, GLM-5).
static_assert(IndexerKlTraits::mma_sparse(true, 128, 64, 576, 128, 2048) &&
                  IndexerKlTraits::mma_sparse(true, 64, 32, 576, 128, 2048),
              "the reference geometries run the sparse KL on the tensor cores");

// The dense ops and optimizer steps (nn.cu, optim.cu): kThreads per block everywhere; column sums in partials of kColChunk rows
// and sums of squares in partials of kSumChunk values, summed in a fixed order (deterministic).
struct NnTraits {
  static constexpr int kThreads = 256;
  static constexpr int64_t kColChunk = 128, kSumChunk = 8192;
  static_assert(kThreads % 32 == 0, "whole warps");
};

// The MoE ops (moe.cu). The grouped products' SIMT tile: 32 x 32 outputs from 32-deep slices of
// the operands in shared memory (8.4 KB), 256 threads each owning one column and 4 rows; chosen
// for correctness first (no GPU measured it yet: docs/cuda.md, what is left for speed). Row tiles
// are numbered expert after expert: at most ceil(rows / 32) + E of them hold rows.
struct MoeTraits {
  static constexpr int kThreads = 256, kTile = 32, kRowGroups = kThreads / kTile;
  static constexpr int kRowsPerThread = kTile / kRowGroups;
  static constexpr int64_t kMaxGroups = 64;  // the router keeps its kept groups in a 64-bit mask
  static constexpr int64_t kMaxGridY = 65535;
  static constexpr int64_t row_tiles(int64_t rows, int64_t E) { return (rows + kTile - 1) / kTile + E; }
  static_assert(kThreads % kTile == 0 && kTile % kRowGroups == 0, "whole rows of threads, whole row groups");
};

}  // namespace hmla::cuda
