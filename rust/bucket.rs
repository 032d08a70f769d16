//! DDP gradient bucket assignment: torch's `_compute_bucket_assignment_by_size`, from metadata.
//!
//! DDP packs gradients into buckets of roughly `limit` bytes so each all-reduce moves one large
//! buffer. Buckets never mix element types or devices, so tensors are grouped by a
//! [`GroupKey`] (torch's `(scalar type, device)`), and each group walks the list of limits on
//! its own: its first bucket uses `limits[0]`, the next one `limits[1]`, and the last limit is
//! reused forever. A bucket closes as soon as its size reaches the limit (`>=`), so the tensor
//! that crosses the limit stays in.
//!
//! Only metadata is needed (byte size, group key), never tensor data, so callers that already
//! hold sizes (DDP, ZeRO) skip the tensors entirely.
//!
//! **Exactly torch's result.** When `tensor_indices` is given, torch does not sort, and the
//! buckets left open at the end come out in the iteration order of a libstdc++
//! `std::unordered_map` keyed by `(scalar type, device)`. [`LeftoverOrder`] replays that map
//! (hash function, bucket count growth, insertion at bucket front, rehash order) so even that
//! order matches.
//!
//! **Validated input.** torch crashes or returns garbage on an empty limit list or on
//! `tensor_indices` that are short, out of range or repeated; here those are errors naming the
//! argument.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// What separates buckets: torch's scalar type id and device bits (`type << 16 | index as u8`,
/// as `hash(torch.device)` gives). Any ids group correctly; torch's ids also reproduce torch's
/// order of leftover buckets when `tensor_indices` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// Element type id (torch's `ScalarType` value).
    pub dtype: i64,
    /// Device id (torch's device hash bits).
    pub device: i64,
}

impl GroupKey {
    /// torch's `c10::get_hash(scalar_type, device)`: a boost-style `hash_combine` with the device
    /// hash as seed and the scalar type as value, in 64-bit wrapping arithmetic.
    fn torch_hash(self) -> u64 {
        let seed = self.device as u64;
        let value = self.dtype as u64;
        seed ^ value
            .wrapping_add(0x9e37_79b9)
            .wrapping_add(seed << 6)
            .wrapping_add(seed >> 2)
    }
}

/// The result: bucket contents (tensor indices) and the size limit each bucket was built under
/// (0 for the single-tensor buckets of sparse gradients), as torch returns them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketAssignment {
    /// Tensor indices of each bucket.
    pub buckets: Vec<Vec<u64>>,
    /// The size limit in force for each bucket.
    pub size_limits: Vec<u64>,
}

/// The inputs, one entry per tensor where per-tensor.
#[derive(Debug, Clone, Copy)]
pub struct BucketRequest<'a> {
    /// Bytes of each tensor (`numel * element_size`).
    pub sizes: &'a [u64],
    /// Group of each tensor.
    pub keys: &'a [GroupKey],
    /// Byte limits, walked per group; the last one repeats.
    pub limits: &'a [u64],
    /// Empty, or one flag per tensor index: that tensor gets a bucket of its own.
    pub expect_sparse_gradient: &'a [bool],
    /// Empty (tensors in natural order, result sorted), or the index of each tensor
    /// (gradient-ready order, result unsorted): a permutation of `0..n`.
    pub tensor_indices: &'a [i64],
}

/// The size facts of one tensor, as a binding reads them: `nbytes` where the tensor has it
/// (every strided tensor), else its layout and, for a sparse layout, its element count and
/// element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorSize {
    /// A tensor with `nbytes`.
    Bytes(u64),
    /// A sparse COO tensor (no `nbytes`).
    SparseCoo,
    /// A tensor of another sparse layout (CSR, CSC, BSR, BSC; no `nbytes`).
    OtherSparse {
        /// `numel()`.
        numel: u64,
        /// `element_size()`.
        element_size: u64,
    },
}

/// Bytes torch's bucketing counts for tensor `index`, by torch's layout rules: `nbytes`;
/// `numel * element_size` for a sparse layout other than COO; a sparse COO tensor is refused
/// with torch's message (its gradients cannot share a bucket).
pub fn tensor_bytes(index: usize, size: TensorSize) -> Result<u64> {
    match size {
        TensorSize::Bytes(bytes) => Ok(bytes),
        TensorSize::SparseCoo => Err(Error::InvalidArgument(format!(
            "No support for sparse tensors. (tensors[{index}] is sparse)"
        ))),
        TensorSize::OtherSparse {
            numel,
            element_size,
        } => Ok(numel.saturating_mul(element_size)),
    }
}

/// One open bucket per group, plus where the group is in the limit list.
#[derive(Debug, Default)]
struct Accumulator {
    indices: Vec<u64>,
    size: u64,
    limit_cursor: usize,
}

/// Checks the arguments torch would crash on or silently misuse.
fn validate(req: &BucketRequest<'_>) -> Result<()> {
    let n = req.sizes.len();
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    if n == 0 {
        return bad("tensors: must not be empty".into());
    }
    if req.keys.len() != n {
        return bad(format!(
            "dtype and device ids: expected {n} entries (one per tensor), got {}",
            req.keys.len()
        ));
    }
    if req.limits.is_empty() {
        return bad("bucket_size_limits: must hold at least one limit".into());
    }
    let sparse = req.expect_sparse_gradient.len();
    if sparse != 0 && sparse != n {
        return bad(format!(
            "expect_sparse_gradient: expected 0 or {n} entries (one per tensor), got {sparse}"
        ));
    }
    let indices = req.tensor_indices;
    if !indices.is_empty() {
        if indices.len() != n {
            return bad(format!(
                "tensor_indices: expected 0 or {n} entries (one per tensor), got {}",
                indices.len()
            ));
        }
        let mut seen_at = vec![usize::MAX; n];
        for (pos, &index) in indices.iter().enumerate() {
            let slot = usize::try_from(index).ok().filter(|&i| i < n);
            let Some(slot) = slot else {
                return bad(format!(
                    "tensor_indices[{pos}] = {index} is out of range for {n} tensors"
                ));
            };
            if seen_at[slot] != usize::MAX {
                return bad(format!(
                    "tensor_indices[{pos}] = {index} repeats tensor_indices[{}]",
                    seen_at[slot]
                ));
            }
            seen_at[slot] = pos;
        }
    }
    Ok(())
}

/// torch's bucket assignment over metadata. See the module docs for the rules.
pub fn assign_buckets(req: &BucketRequest<'_>) -> Result<BucketAssignment> {
    validate(req)?;
    let n = req.sizes.len();
    let mut out = BucketAssignment::default();
    let mut groups: Vec<(GroupKey, Accumulator)> = Vec::new();
    let mut group_of: HashMap<GroupKey, usize> = HashMap::new();
    let mut last: Option<(GroupKey, usize)> = None;

    for i in 0..n {
        let index = match req.tensor_indices.get(i) {
            Some(&given) => given as u64,
            None => i as u64,
        };
        if req.expect_sparse_gradient.get(index as usize) == Some(&true) {
            out.buckets.push(vec![index]);
            out.size_limits.push(0);
            continue;
        }
        let key = req.keys[i];
        let slot = match last {
            Some((k, slot)) if k == key => slot,
            _ => *group_of.entry(key).or_insert_with(|| {
                groups.push((key, Accumulator::default()));
                groups.len() - 1
            }),
        };
        last = Some((key, slot));
        let acc = &mut groups[slot].1;
        acc.indices.push(index);
        acc.size = acc.size.saturating_add(req.sizes[i]);
        let limit = req.limits[acc.limit_cursor];
        if acc.size >= limit {
            let full = acc.indices.len();
            out.buckets.push(std::mem::replace(
                &mut acc.indices,
                Vec::with_capacity(full),
            ));
            out.size_limits.push(limit);
            acc.size = 0;
            if acc.limit_cursor + 1 < req.limits.len() {
                acc.limit_cursor += 1;
            }
        }
    }

    let keys: Vec<GroupKey> = groups.iter().map(|(k, _)| *k).collect();
    for slot in LeftoverOrder::of(&keys) {
        let acc = &mut groups[slot].1;
        if !acc.indices.is_empty() {
            out.buckets.push(std::mem::take(&mut acc.indices));
            out.size_limits.push(req.limits[acc.limit_cursor]);
        }
    }

    if req.tensor_indices.is_empty() {
        // Indices inside a bucket ascend, so its first one is its smallest; all are distinct.
        let mut order: Vec<usize> = (0..out.buckets.len()).collect();
        order.sort_unstable_by_key(|&b| out.buckets[b][0]);
        let mut buckets = std::mem::take(&mut out.buckets);
        out.size_limits = order.iter().map(|&b| out.size_limits[b]).collect();
        out.buckets = order
            .iter()
            .map(|&b| std::mem::take(&mut buckets[b]))
            .collect();
    }
    Ok(out)
}

/// Replays the iteration order of a libstdc++ `std::unordered_map` (unique keys, prime
/// rehash policy, max load factor 1) after inserting `keys` in order, as torch's map of open
/// buckets iterates at the end. Returns positions into `keys`.
pub struct LeftoverOrder;

/// libstdc++'s bucket counts as the map grows: the first insert allocates 13 buckets, then
/// each growth (when the element count would pass the bucket count) takes the smallest prime of
/// its list at or above twice the count. Beyond 257 groups (never seen in practice) the last
/// count is kept, and the order is no longer guaranteed to be torch's.
const BUCKET_COUNTS: [u64; 5] = [13, 29, 59, 127, 257];

impl LeftoverOrder {
    /// The iteration order of a map filled with `keys` (distinct, in insertion order).
    pub fn of(keys: &[GroupKey]) -> Vec<usize> {
        let hashes: Vec<u64> = keys.iter().map(|k| k.torch_hash()).collect();
        // The map's singly linked node list, front first.
        let mut list: Vec<usize> = Vec::with_capacity(keys.len());
        let mut level = 0;
        for node in 0..keys.len() {
            while node as u64 + 1 > BUCKET_COUNTS[level] && level + 1 < BUCKET_COUNTS.len() {
                level += 1;
                list = Self::rehash(&list, &hashes, BUCKET_COUNTS[level]);
            }
            Self::insert_front_of_bucket(&mut list, &hashes, node, BUCKET_COUNTS[level]);
        }
        list
    }

    /// Inserts `node` at the front of its bucket's run when the bucket has nodes, else at the
    /// front of the whole list (libstdc++'s `_M_insert_bucket_begin`).
    fn insert_front_of_bucket(list: &mut Vec<usize>, hashes: &[u64], node: usize, buckets: u64) {
        let bucket = hashes[node] % buckets;
        let at = list
            .iter()
            .position(|&n| hashes[n] % buckets == bucket)
            .unwrap_or(0);
        list.insert(at, node);
    }

    /// libstdc++'s rehash: walks the old list front to back, re-inserting each node the same way.
    fn rehash(list: &[usize], hashes: &[u64], buckets: u64) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::with_capacity(list.len() + 1);
        for &node in list {
            Self::insert_front_of_bucket(&mut out, hashes, node, buckets);
        }
        out
    }
}
