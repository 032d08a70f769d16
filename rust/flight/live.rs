//! The live view: the rank summaries that the jobs' watchdogs publish to a store, found among
//! its keys and read into what a person (`GET /flight`) or Prometheus (`GET /metrics`) is shown
//! by `ferrodist-store --metrics-addr`.
//!
//! A watchdog sets `<prefix>ferrodist/flight/<rank>`, the prefix being whatever its store
//! prepends: nothing for a job's plain `TCPStore`, `default_pg/` or torchrun's
//! `/worker/attempt_0/` for a `PrefixStore`, and on the wire torch's TCP client puts one more
//! `/` in front of every key (the server holds `/ferrodist/flight/0` for a plain job's rank 0).
//! So the prefix, less that `/`, names the job, and one server serving many jobs shows each apart.
//!
//! Reading is bounded, since anyone with store access writes these keys and the view runs on
//! every scrape: at most [`MAX_JOBS`] jobs (by prefix order) and [`MAX_RANKS`] ranks of each (the
//! lowest), a value over [`MAX_SUMMARY_BYTES`] is not parsed, and at most [`MAX_READ_BYTES`] are
//! read in all; what is left out is counted and said. A value that is not a summary of this
//! format is skipped and counted, never a panic. Rendering is in [`super::live_text`].

use std::collections::BTreeMap;

use bytes::Bytes;

use super::summary::RankSummary;
use crate::store::db::Db;

/// What a summary key holds between its job prefix and its rank.
pub const KEY_MARK: &[u8] = b"ferrodist/flight/";
/// Most jobs shown.
pub const MAX_JOBS: usize = 16;
/// Most ranks shown per job (the lowest).
pub const MAX_RANKS: usize = 64;
/// Largest summary parsed (a real one is a few tens of KB: 64 signatures, 8 pending ops).
pub const MAX_SUMMARY_BYTES: usize = 1 << 20;
/// Most summary bytes read for one view.
pub const MAX_READ_BYTES: usize = 64 << 20;
/// A heartbeat older than this is stale: the watchdog publishes at least every 5 s, so six
/// beats were missed (the rank finished, was stopped, or died).
pub const STALE_AFTER_MS: u64 = 30_000;

/// One job's ranks, as found.
#[derive(Debug)]
pub struct JobView {
    /// The key prefix that names the job (`""` for none), lossily decoded.
    pub prefix: String,
    /// Ranks with a summary key, shown or not.
    pub ranks_found: usize,
    /// The summaries read, by rank.
    pub ranks: Vec<RankSummary>,
    /// Ranks whose summary could not be read, with why.
    pub malformed: Vec<(usize, String)>,
    /// Ranks not read: over [`MAX_RANKS`] or the read budget.
    pub not_shown: usize,
}

/// Every job found in a store, at one moment.
#[derive(Debug)]
pub struct LiveView {
    /// When it was read (unix ms, this host's clock).
    pub now_ms: u64,
    /// The jobs shown, by prefix.
    pub jobs: Vec<JobView>,
    /// Jobs found beyond [`MAX_JOBS`].
    pub jobs_not_shown: usize,
    /// Ranks of those jobs.
    pub ranks_of_jobs_not_shown: usize,
}

/// The job prefix and rank of a summary key, or None for any other key (the watchdog's
/// `ferrodist/flight/logged/...` claims included).
pub fn parse_key(key: &[u8]) -> Option<(&[u8], usize)> {
    let at = key.windows(KEY_MARK.len()).rposition(|w| w == KEY_MARK)?;
    let (prefix, digits) = (&key[..at], &key[at + KEY_MARK.len()..]);
    if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // A prefix store joins with `/`: anything else is some other key that contains the mark.
    if !(prefix.is_empty() || prefix.ends_with(b"/")) {
        return None;
    }
    let rank = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let prefix = prefix.strip_prefix(b"/").unwrap_or(prefix);
    Some((prefix, rank))
}

impl LiveView {
    /// The view of the summaries among `keys`, each value fetched with `read` (None: the key
    /// went away meanwhile, or its value is over `max_bytes`, given as `Err(len)`).
    pub fn collect<K, R>(keys: K, mut read: R, now_ms: u64) -> LiveView
    where
        K: IntoIterator<Item = Bytes>,
        R: FnMut(&[u8], usize) -> Option<Result<Vec<u8>, usize>>,
    {
        let mut found: BTreeMap<Vec<u8>, BTreeMap<usize, Bytes>> = BTreeMap::new();
        for key in keys {
            if let Some((prefix, rank)) = parse_key(&key) {
                let prefix = prefix.to_vec();
                found.entry(prefix).or_default().insert(rank, key);
            }
        }
        let mut budget = MAX_READ_BYTES;
        let mut jobs = Vec::new();
        let mut jobs_not_shown = 0;
        let mut ranks_of_jobs_not_shown = 0;
        for (i, (prefix, ranks)) in found.into_iter().enumerate() {
            if i >= MAX_JOBS {
                jobs_not_shown += 1;
                ranks_of_jobs_not_shown += ranks.len();
                continue;
            }
            let mut job = JobView {
                prefix: String::from_utf8_lossy(&prefix).into_owned(),
                ranks_found: ranks.len(),
                ranks: Vec::new(),
                malformed: Vec::new(),
                not_shown: ranks.len().saturating_sub(MAX_RANKS),
            };
            for (rank, key) in ranks.into_iter().take(MAX_RANKS) {
                let limit = MAX_SUMMARY_BYTES.min(budget);
                match read(&key, limit) {
                    None => job.ranks_found -= 1,
                    Some(Err(len)) if len > MAX_SUMMARY_BYTES => job
                        .malformed
                        .push((rank, format!("{len} bytes, over {MAX_SUMMARY_BYTES}"))),
                    Some(Err(_)) => job.not_shown += 1,
                    Some(Ok(value)) => {
                        budget -= value.len();
                        match parse(&value, rank) {
                            Ok(summary) => job.ranks.push(summary),
                            Err(why) => job.malformed.push((rank, why)),
                        }
                    }
                }
            }
            jobs.push(job);
        }
        LiveView {
            now_ms,
            jobs,
            jobs_not_shown,
            ranks_of_jobs_not_shown,
        }
    }

    /// The view of the summaries in `db` now.
    pub fn of_db(db: &Db) -> LiveView {
        let keys = db.keys_where(|k| parse_key(k).is_some());
        let read = |key: &[u8], limit: usize| {
            db.value_with(key, |v| {
                if v.len() > limit {
                    Err(v.len())
                } else {
                    Ok(v.to_vec())
                }
            })
        };
        LiveView::collect(keys, read, super::now_ms())
    }

    /// Summaries that could not be read, in the jobs shown.
    pub fn malformed(&self) -> usize {
        self.jobs.iter().map(|j| j.malformed.len()).sum()
    }

    /// Ranks found and not shown, over every job.
    pub fn ranks_not_shown(&self) -> usize {
        self.ranks_of_jobs_not_shown + self.jobs.iter().map(|j| j.not_shown).sum::<usize>()
    }
}

/// A summary of `rank`, or why not.
fn parse(value: &[u8], rank: usize) -> Result<RankSummary, String> {
    let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_string())?;
    let summary = RankSummary::from_json(text).map_err(|e| match e {
        crate::Error::InvalidArgument(why) => why,
        other => other.to_string(),
    })?;
    if summary.rank != rank {
        return Err(format!(
            "names rank {} under rank {rank}'s key",
            summary.rank
        ));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::summary::SUMMARY_VERSION;

    fn summary(rank: usize) -> RankSummary {
        RankSummary {
            version: SUMMARY_VERSION,
            rank,
            pid: 7,
            host: "h".into(),
            heartbeat_ms: 1_000,
            last_completed: None,
            pending: vec![],
            recent: vec![],
            last_seq: BTreeMap::new(),
        }
    }

    fn db_with(pairs: &[(&str, String)]) -> Db {
        let db = Db::new();
        for (k, v) in pairs {
            db.set(Bytes::copy_from_slice(k.as_bytes()), Bytes::from(v.clone()));
        }
        db
    }

    #[test]
    fn keys_name_their_job_by_prefix_less_the_wire_slash() {
        assert_eq!(parse_key(b"/ferrodist/flight/0"), Some((&b""[..], 0)));
        assert_eq!(parse_key(b"ferrodist/flight/12"), Some((&b""[..], 12)));
        assert_eq!(
            parse_key(b"/default_pg/ferrodist/flight/3"),
            Some((&b"default_pg/"[..], 3))
        );
        assert_eq!(
            parse_key(b"//worker/attempt_0/ferrodist/flight/1"),
            Some((&b"/worker/attempt_0/"[..], 1))
        );
        for other in [
            &b"/ferrodist/flight/logged/WORLD:4"[..],
            b"/ferrodist/flight/",
            b"/ferrodist/flight/1x",
            b"/xferrodist/flight/1",
            b"/ferrodist/flight/99999999999",
            b"/ferrodist/rendezvous/0/count",
        ] {
            assert_eq!(parse_key(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn jobs_are_grouped_and_malformed_summaries_counted_not_fatal() {
        let mut liar = summary(9);
        liar.rank = 4;
        let db = db_with(&[
            ("/ferrodist/flight/1", summary(1).to_json()),
            ("/ferrodist/flight/0", summary(0).to_json()),
            ("/b/ferrodist/flight/0", summary(0).to_json()),
            ("/b/ferrodist/flight/2", "{not json".into()),
            ("/b/ferrodist/flight/3", r#"{"version":99}"#.into()),
            ("/b/ferrodist/flight/5", liar.to_json()),
            ("/b/ferrodist/flight/logged/WORLD:1", "1".into()),
            ("/other", "x".into()),
        ]);
        let view = LiveView::of_db(&db);
        let prefixes: Vec<&str> = view.jobs.iter().map(|j| j.prefix.as_str()).collect();
        assert_eq!(prefixes, ["", "b/"]);
        let ranks: Vec<usize> = view.jobs[0].ranks.iter().map(|s| s.rank).collect();
        assert_eq!(ranks, [0, 1]);
        let b = &view.jobs[1];
        assert_eq!((b.ranks_found, b.ranks.len(), view.malformed()), (4, 1, 3));
        let bad: Vec<usize> = b.malformed.iter().map(|(r, _)| *r).collect();
        assert_eq!(bad, [2, 3, 5]);
        assert!(b.malformed[1].1.contains("version 99"), "{:?}", b.malformed);
        assert!(
            b.malformed[2].1.contains("names rank 4"),
            "{:?}",
            b.malformed
        );
    }

    #[test]
    fn jobs_ranks_and_sizes_are_capped_and_the_rest_counted() {
        let mut pairs = Vec::new();
        for rank in 0..MAX_RANKS + 5 {
            pairs.push((
                format!("/big/ferrodist/flight/{rank}"),
                summary(rank).to_json(),
            ));
        }
        for job in 0..MAX_JOBS + 2 {
            pairs.push((
                format!("/j{job:02}/ferrodist/flight/0"),
                summary(0).to_json(),
            ));
        }
        let huge = " ".repeat(MAX_SUMMARY_BYTES + 1);
        pairs.push(("/a/ferrodist/flight/0".into(), huge));
        let db = Db::new();
        for (k, v) in pairs {
            db.set(Bytes::from(k), Bytes::from(v));
        }
        let view = LiveView::of_db(&db);
        assert_eq!(view.jobs.len(), MAX_JOBS);
        assert_eq!(view.jobs[0].prefix, "a/");
        assert!(view.jobs[0].malformed[0].1.contains("over"));
        assert_eq!(view.jobs[1].prefix, "big/");
        assert_eq!(view.jobs[1].ranks.len(), MAX_RANKS);
        assert_eq!(view.jobs[1].ranks.last().unwrap().rank, MAX_RANKS - 1);
        // "a", "big" and j00..j13 shown; j14..j17 not: 4 jobs of one rank each.
        assert_eq!((view.jobs_not_shown, view.ranks_of_jobs_not_shown), (4, 4));
        assert_eq!(view.ranks_not_shown(), 5 + 4);
    }

    #[test]
    fn the_read_budget_leaves_ranks_out_instead_of_reading_without_end() {
        let keys: Vec<Bytes> = (0..3)
            .map(|r| Bytes::from(format!("/ferrodist/flight/{r}")))
            .collect();
        let mut asked = Vec::new();
        // Each value claims more than the budget has left after the first.
        let view = LiveView::collect(
            keys,
            |_, limit| {
                asked.push(limit);
                if limit < MAX_SUMMARY_BYTES {
                    Some(Err(limit + 1))
                } else {
                    Some(Ok(vec![b' '; MAX_READ_BYTES - 10]))
                }
            },
            0,
        );
        assert_eq!(asked, [MAX_SUMMARY_BYTES, 10, 10]);
        let job = &view.jobs[0];
        assert_eq!((job.malformed.len(), job.not_shown), (1, 2));
    }
}
