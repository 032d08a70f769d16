//! Sorted-greedy partitioning of parameters across ranks (ZeRO stage 1).
//!
//! `ZeroRedundancyOptimizer` gives each rank the optimizer state of a subset of the parameters.
//! Every rank must compute the *same* partition without talking to the others, so the algorithm
//! is deterministic: within each parameter group, parameters are visited largest first (a stable
//! sort, so equal sizes keep their registration order) and each goes to the rank with the fewest
//! elements so far (ties go to the lowest rank). The per-rank running sizes are shared by all
//! groups, so a later group fills the ranks that earlier groups left light. This is torch's
//! documented assignment; keeping it identical is what makes ferrodist's shards (and therefore
//! its results) match torch's bit for bit.
//!
//! [`assign_ddp_buckets`] is the overlap-mode counterpart: it hands DDP's gradient buckets (or
//! slices of them) to ranks, so each rank steps the parameters whose gradients it owns.

use crate::error::{Error, Result, Unplannable};

/// Partitions every group's parameters across `world_size` ranks.
///
/// `group_sizes[g][i]` is the element count of parameter `i` of group `g`. The result is indexed
/// `[g][rank]` and lists the in-group indices assigned to that rank, in assignment order (largest
/// first). Each index appears exactly once across the ranks of its group.
pub fn sorted_greedy_partition(
    group_sizes: &[Vec<u64>],
    world_size: usize,
) -> Result<Vec<Vec<Vec<usize>>>> {
    if world_size == 0 {
        return Err(Error::InvalidArgument(
            "world_size must be at least 1".to_string(),
        ));
    }
    let mut assigned = vec![0u64; world_size];
    let mut result = Vec::with_capacity(group_sizes.len());
    for sizes in group_sizes {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        // `sort_by` is stable: equal sizes keep their original order, as torch's `sorted` does.
        order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
        let mut per_rank = vec![Vec::new(); world_size];
        for index in order {
            let rank = least_loaded(&assigned);
            per_rank[rank].push(index);
            assigned[rank] += sizes[index];
        }
        result.push(per_rank);
    }
    Ok(result)
}

/// The first rank holding the fewest elements.
fn least_loaded(assigned: &[u64]) -> usize {
    let mut best = 0;
    for (rank, &size) in assigned.iter().enumerate() {
        if size < assigned[best] {
            best = rank;
        }
    }
    best
}

/// One contiguous slice of a DDP gradient bucket assigned to one rank (ZeRO overlap mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSlice {
    /// Index of the DDP bucket.
    pub bucket: usize,
    /// Rank that updates this slice.
    pub rank: usize,
    /// Index of the slice's first parameter within the bucket.
    pub offset: usize,
    /// Number of parameters in the slice (never zero).
    pub len: usize,
}

/// Assigns DDP gradient buckets (or contiguous slices of them) to ranks for ZeRO overlap mode.
///
/// `bucket_sizes[b]` lists the element counts of bucket `b`'s parameters in bucket order. With
/// `shard_buckets == false` bucket `b` goes wholly to rank `b % world_size`. With `true`, buckets
/// are visited smallest first (stable) and cut into slices of fewer than `total / world_size`
/// elements where possible; each slice goes to the least-loaded rank that holds no other slice of
/// the same bucket (ties to the lowest rank). Slices come back in assignment order, which is the
/// order their parameters join the owning rank's local optimizer.
pub fn assign_ddp_buckets(
    bucket_sizes: &[Vec<u64>],
    world_size: usize,
    shard_buckets: bool,
) -> Result<Vec<BucketSlice>> {
    if world_size == 0 {
        return Err(Error::InvalidArgument(
            "world_size must be at least 1".to_string(),
        ));
    }
    if let Some(bucket) = bucket_sizes.iter().position(Vec::is_empty) {
        return Err(Error::Unplannable(Unplannable::EmptyBucket {
            index: bucket,
        }));
    }
    if !shard_buckets {
        return Ok(bucket_sizes
            .iter()
            .enumerate()
            .map(|(bucket, sizes)| BucketSlice {
                bucket,
                rank: bucket % world_size,
                offset: 0,
                len: sizes.len(),
            })
            .collect());
    }
    let total: u64 = bucket_sizes.iter().flatten().sum();
    let ranks = world_size as u64;
    // `size >= total / world_size`, in integers so no float rounding can move a cut.
    let reaches_threshold = |size: u64| size * ranks >= total;
    let mut order: Vec<usize> = (0..bucket_sizes.len()).collect();
    order.sort_by_key(|&b| bucket_sizes[b].iter().sum::<u64>());
    let mut load = vec![0u64; world_size];
    let mut slices = Vec::new();
    for bucket in order {
        let sizes = &bucket_sizes[bucket];
        let mut taken = vec![false; world_size];
        let mut offset = 0;
        let mut running = 0u64;
        let mut assign = |offset: usize, end: usize, size: u64, taken: &mut Vec<bool>| {
            let rank = least_loaded_allowed(&load, taken)
                .ok_or(Error::Unplannable(Unplannable::NoRankAllowed { bucket }))?;
            taken[rank] = true;
            load[rank] += size;
            slices.push(BucketSlice {
                bucket,
                rank,
                offset,
                len: end - offset,
            });
            Ok::<(), Error>(())
        };
        for (index, &numel) in sizes.iter().enumerate() {
            if reaches_threshold(running + numel) && index > offset {
                assign(offset, index, running, &mut taken)?;
                offset = index;
                running = 0;
            }
            running += numel;
        }
        assign(offset, sizes.len(), running, &mut taken)?;
    }
    Ok(slices)
}

/// The first rank with the fewest elements among those not marked `taken`.
fn least_loaded_allowed(load: &[u64], taken: &[bool]) -> Option<usize> {
    (0..load.len())
        .filter(|&rank| !taken[rank])
        .fold(None, |best, rank| match best {
            Some(b) if load[b] <= load[rank] => Some(b),
            _ => Some(rank),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_buckets_go_round_robin() {
        let slices = assign_ddp_buckets(&[vec![1, 2], vec![3], vec![4]], 2, false).unwrap();
        let ranks: Vec<usize> = slices.iter().map(|s| s.rank).collect();
        assert_eq!(ranks, vec![0, 1, 0]);
        assert_eq!(slices[0].len, 2);
    }

    #[test]
    fn sharded_buckets_cut_at_the_threshold_and_spread_ranks() {
        // total 40, threshold 20 on 2 ranks: the 30-element bucket splits after 10 + 5.
        let slices = assign_ddp_buckets(&[vec![10, 5, 15], vec![6, 4]], 2, true).unwrap();
        assert_eq!(
            slices,
            vec![
                BucketSlice {
                    bucket: 1,
                    rank: 0,
                    offset: 0,
                    len: 2
                },
                BucketSlice {
                    bucket: 0,
                    rank: 1,
                    offset: 0,
                    len: 2
                },
                BucketSlice {
                    bucket: 0,
                    rank: 0,
                    offset: 2,
                    len: 1
                },
            ]
        );
    }

    #[test]
    fn empty_bucket_is_rejected_naming_it() {
        let err = assign_ddp_buckets(&[vec![1], vec![]], 2, true).unwrap_err();
        assert!(matches!(
            err,
            Error::Unplannable(Unplannable::EmptyBucket { index: 1 })
        ));
        assert_eq!(err.to_string(), "Empty bucket (index 1)", "torch's text");
    }

    #[test]
    fn a_bucket_with_more_slices_than_ranks_names_the_bucket() {
        // Three equal parameters, two ranks: each slice stays below total / 2, so three slices.
        let err = assign_ddp_buckets(&[vec![60, 60, 60]], 2, true).unwrap_err();
        assert!(matches!(
            err,
            Error::Unplannable(Unplannable::NoRankAllowed { bucket: 0 })
        ));
        assert_eq!(
            err.to_string(),
            "All indices are disallowed",
            "torch's text"
        );
    }

    #[test]
    fn matches_torch_documented_example() {
        let sizes = vec![vec![9, 7, 5, 3, 9, 7, 5, 3, 1]];
        let parts = sorted_greedy_partition(&sizes, 2).unwrap();
        let mut r0 = parts[0][0].clone();
        r0.sort_unstable();
        let mut r1 = parts[0][1].clone();
        r1.sort_unstable();
        assert_eq!(r0, vec![0, 1, 2, 3, 8]);
        assert_eq!(r1, vec![4, 5, 6, 7]);
    }

    #[test]
    fn sizes_are_shared_across_groups() {
        let sizes = vec![vec![4, 4], vec![4, 4, 10]];
        let parts = sorted_greedy_partition(&sizes, 2).unwrap();
        assert_eq!(parts[0], vec![vec![0], vec![1]]);
        assert_eq!(parts[1], vec![vec![2], vec![0, 1]]);
    }

    #[test]
    fn every_index_is_assigned_exactly_once() {
        let sizes = vec![(0..50u64).map(|i| (i * 37) % 11).collect::<Vec<_>>()];
        for world in 1..6 {
            let parts = sorted_greedy_partition(&sizes, world).unwrap();
            let mut all: Vec<usize> = parts[0].iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..50).collect::<Vec<_>>());
        }
    }

    #[test]
    fn rejects_zero_world_size() {
        assert!(sorted_greedy_partition(&[vec![1]], 0).is_err());
    }
}
