//! Invariants of the FSDP flat-parameter layout over random parameter sizes and world sizes:
//! equal shards that cover the flat parameter exactly once, padding where torch puts it, and
//! per-rank parameter slices that agree with the parameter offsets.

use ferrodist::fsdp::layout::plan_flat_param;
use proptest::prelude::*;

fn numels() -> impl Strategy<Value = Vec<i64>> {
    // Zero-numel parameters are common enough to matter; keep at least one element overall.
    proptest::collection::vec(prop_oneof![1 => Just(0i64), 4 => 1i64..200], 1..12)
        .prop_filter("at least one element", |n| n.iter().any(|&x| x > 0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn shards_are_equal_and_cover_the_flat_param_once(
        numels in numels(),
        itemsize in prop_oneof![Just(1i64), Just(2), Just(4), Just(8), Just(32)],
        world_size in 1i64..40,
        align in any::<bool>(),
    ) {
        let layout = plan_flat_param(&numels, itemsize, world_size, align).unwrap();
        let total: u64 = layout.numels_with_padding.iter().sum();
        prop_assert_eq!(total, layout.flat_numel);
        prop_assert_eq!(layout.shard_numel, layout.flat_numel.div_ceil(world_size as u64));
        prop_assert_eq!(layout.padded_unsharded_numel(), layout.shard_numel * world_size as u64);
        let mut covered = 0u64;
        for rank in 0..world_size {
            let (start, end) = layout.shard_range(rank).unwrap();
            prop_assert_eq!(start, covered, "shards are contiguous, in rank order");
            prop_assert!(end - start <= layout.shard_numel);
            prop_assert_eq!(end - start + layout.shard_padding(rank).unwrap(), layout.shard_numel);
            covered = end;
        }
        prop_assert_eq!(covered, layout.flat_numel);
    }

    #[test]
    fn padding_sits_where_torch_puts_it(
        numels in numels(),
        itemsize in prop_oneof![Just(1i64), Just(2), Just(4), Just(8)],
        world_size in 1i64..40,
        align in any::<bool>(),
    ) {
        let layout = plan_flat_param(&numels, itemsize, world_size, align).unwrap();
        let params: Vec<u64> = layout.numels_with_padding.iter().zip(&layout.is_padding_mask)
            .filter(|(_, &pad)| !pad).map(|(&n, _)| n).collect();
        prop_assert_eq!(&params, &layout.numels);
        if !align {
            prop_assert!(layout.is_padding_mask.iter().all(|&pad| !pad));
        } else {
            let aligned = (16 / itemsize) as u64;
            prop_assert!(layout.param_offsets.iter().all(|&o| o % aligned == 0));
            prop_assert_eq!(layout.flat_numel % world_size as u64, 0);
            prop_assert!(layout.numels_with_padding.iter().zip(&layout.is_padding_mask)
                .all(|(&n, &pad)| !pad || (n > 0 && n < aligned.max(world_size as u64))));
        }
        let mut offset = 0;
        let mut param = 0;
        for (&n, &pad) in layout.numels_with_padding.iter().zip(&layout.is_padding_mask) {
            if !pad {
                prop_assert_eq!(layout.param_offsets[param], offset);
                param += 1;
            }
            offset += n;
        }
    }

    #[test]
    fn shard_infos_hold_every_element_once_at_its_offset(
        numels in numels(),
        world_size in 1i64..40,
        align in any::<bool>(),
    ) {
        let layout = plan_flat_param(&numels, 4, world_size, align).unwrap();
        let mut held = vec![0u64; numels.len()];
        for rank in 0..world_size {
            let shard_start = layout.shard_numel * rank as u64;
            let infos = layout.shard_param_infos(rank).unwrap();
            prop_assert_eq!(infos.len(), numels.len());
            for (i, info) in infos.iter().enumerate() {
                let Some(s) = info else { continue };
                prop_assert!(s.offset_in_shard < layout.shard_numel);
                prop_assert_eq!(s.intra_param_end_idx + 1 - s.intra_param_start_idx as i64,
                    s.numel_in_shard as i64);
                // The slice's flat position is the parameter's offset plus the intra index.
                prop_assert_eq!(shard_start + s.offset_in_shard,
                    layout.param_offsets[i] + s.intra_param_start_idx);
                held[i] += s.numel_in_shard;
            }
        }
        prop_assert_eq!(held, layout.numels.clone());
        let whole = layout.unsharded_param_infos();
        for (i, info) in whole.iter().enumerate() {
            match info {
                Some(s) => {
                    prop_assert_eq!(s.numel_in_shard, layout.numels[i]);
                    prop_assert_eq!(s.offset_in_shard, layout.param_offsets[i]);
                }
                // An empty parameter at either end of the flat parameter meets no range.
                None => prop_assert_eq!(layout.numels[i], 0),
            }
        }
    }
}
