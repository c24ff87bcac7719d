//! Delta debugging (Zeller's ddmin) over a list of items: the smallest
//! subset, 1-minimal, for which a test still fails. The campaign shrinks a
//! finding's faults and steps with it, each trial replayed from the root,
//! the trials of a round on every worker at once ([`ddmin_batched`];
//! `crate::shrink_finding`).

/// What [`ddmin_batched`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reduction<T> {
    /// The 1-minimal subset (or the smallest one reached within the
    /// budget), in the items' order.
    pub kept: Vec<T>,
    /// Trials as the sequential ddmin counts them (up to and including the
    /// one that fails in each round): the same whatever the batch width.
    pub trials: usize,
    /// The subsets tried, as batches were run (a batch's trials after its
    /// first failing one included): at least `trials`, at most `width - 1`
    /// more per subset chosen.
    pub tried: usize,
    /// Each subset ddmin moved to, in order (the last is `kept`, unless
    /// the empty set was tried and failed: then it is `[]`).
    pub chosen: Vec<Vec<T>>,
}

/// A 1-minimal subset of `items` on which `fails` holds (given that it holds
/// on all of `items`), trying at most `max_trials` subsets; `fails` is not
/// called on the whole set. Order is kept. The subset and the trials.
pub fn ddmin<T: Clone>(
    items: &[T],
    max_trials: usize,
    mut fails: impl FnMut(&[T]) -> bool,
) -> (Vec<T>, usize) {
    let reduction = ddmin_batched(items, max_trials, 1, |batch| {
        Ok::<_, std::convert::Infallible>(fails(&batch[0]).then_some(0))
    });
    match reduction {
        Ok(r) => (r.kept, r.trials),
        Err(never) => match never {},
    }
}

/// [`ddmin`] with the independent trials of a round (each chunk alone,
/// then everything but each chunk) tried `width` at a time:
/// `first_failing` gets a batch of subsets (at most `width`, in the
/// sequential order), tries them (at once) and says which is the first, in
/// the batch's order, on which the failure holds. ddmin moves on from that
/// one, as the sequential ddmin would have, so the result (subset, trials,
/// subsets chosen) is the same for every width; a larger width only runs
/// more of a round's trials at once. `max_trials` bounds the trials as
/// the sequential ddmin counts them (the rounds), so a batch may run up to
/// `width - 1` trials past the first failing one, at once with it. An
/// error from `first_failing` ends the reduction.
pub fn ddmin_batched<T: Clone, E>(
    items: &[T],
    max_trials: usize,
    width: usize,
    mut first_failing: impl FnMut(&[Vec<T>]) -> Result<Option<usize>, E>,
) -> Result<Reduction<T>, E> {
    let width = width.max(1);
    let mut current: Vec<T> = items.to_vec();
    let mut trials = 0usize;
    let mut tried = 0usize;
    let mut chosen = Vec::new();
    let mut n = 2usize;
    // The first of `candidates` that fails, tried in batches within the
    // budget; `None` when none does (or the budget ran out).
    let mut search = |candidates: &[Vec<T>],
                      trials: &mut usize,
                      tried: &mut usize|
     -> Result<Option<usize>, E> {
        let mut start = 0;
        while start < candidates.len() && *trials < max_trials {
            let take = width
                .min(max_trials - *trials)
                .min(candidates.len() - start);
            let batch = &candidates[start..start + take];
            *tried += take;
            match first_failing(batch)? {
                Some(i) if i < take => {
                    *trials += i + 1;
                    return Ok(Some(start + i));
                }
                _ => *trials += take,
            }
            start += take;
        }
        Ok(None)
    };
    while current.len() >= 2 && trials < max_trials {
        let chunks = split(&current, n);
        // Each chunk alone, then (with more than two) everything but each.
        let mut candidates = chunks.clone();
        if chunks.len() > 2 {
            candidates.extend((0..chunks.len()).map(|i| {
                chunks
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .flat_map(|(_, c)| c.iter().cloned())
                    .collect::<Vec<T>>()
            }));
        }
        match search(&candidates, &mut trials, &mut tried)? {
            Some(i) => {
                current = candidates.swap_remove(i);
                chosen.push(current.clone());
                n = if i < chunks.len() { 2 } else { (n - 1).max(2) };
            }
            None => {
                if n >= current.len() {
                    break;
                }
                n = (2 * n).min(current.len());
            }
        }
    }
    // The empty set too: a failure that needs none of the items.
    if current.len() == 1 && search(&[Vec::new()], &mut trials, &mut tried)?.is_some() {
        current.clear();
        chosen.push(Vec::new());
    }
    Ok(Reduction {
        kept: current,
        trials,
        tried,
        chosen,
    })
}

fn split<T: Clone>(items: &[T], n: usize) -> Vec<Vec<T>> {
    let n = n.min(items.len()).max(1);
    let mut chunks = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let end = start + (items.len() - start) / (n - i);
        chunks.push(items[start..end].to_vec());
        start = end;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ddmin_finds_the_one_culprit() {
        let items: Vec<u32> = (0..16).collect();
        let (min, trials) = ddmin(&items, 100, |s| s.contains(&11));
        assert_eq!(min, vec![11]);
        assert!(trials < 20, "{trials}");
    }

    #[test]
    fn test_ddmin_keeps_a_pair_that_fails_only_together() {
        let items: Vec<u32> = (0..10).collect();
        let (min, _) = ddmin(&items, 200, |s| s.contains(&2) && s.contains(&7));
        assert_eq!(min, vec![2, 7]);
    }

    #[test]
    fn test_ddmin_empties_a_set_that_is_not_needed_and_respects_the_budget() {
        let items: Vec<u32> = (0..4).collect();
        let (min, _) = ddmin(&items, 100, |_| true);
        assert!(min.is_empty());
        let (min, trials) = ddmin(&items, 1, |s| s.contains(&3));
        assert_eq!(trials, 1);
        assert!(min.contains(&3));
    }
    /// A failure predicate over subsets of 0..n.
    type Fails = Box<dyn Fn(&[u32]) -> bool>;

    /// Failure predicates of several shapes, each with its n.
    fn predicates() -> Vec<(usize, Fails)> {
        vec![
            (16, Box::new(|s: &[u32]| s.contains(&11))),
            (10, Box::new(|s: &[u32]| s.contains(&2) && s.contains(&7))),
            (
                13,
                Box::new(|s: &[u32]| s.iter().filter(|&&x| x % 3 == 0).count() >= 3),
            ),
            (9, Box::new(|s: &[u32]| s.contains(&0) || s.contains(&8))),
            (6, Box::new(|_: &[u32]| true)),
            (1, Box::new(|s: &[u32]| s.contains(&0))),
            (0, Box::new(|_: &[u32]| true)),
        ]
    }

    #[test]
    fn test_batches_of_any_width_choose_as_the_sequential_ddmin_does() {
        for (n, fails) in predicates() {
            let items: Vec<u32> = (0..n as u32).collect();
            for budget in [3, 7, 48] {
                let run = |width: usize| {
                    let mut batches = Vec::new();
                    let r = ddmin_batched(&items, budget, width, |batch| {
                        assert!(batch.len() <= width);
                        batches.push(batch.len());
                        Ok::<_, ()>(batch.iter().position(|s| fails(s)))
                    })
                    .unwrap();
                    (r, batches)
                };
                let (one, batches_one) = run(1);
                assert_eq!(
                    (one.kept.clone(), one.trials),
                    ddmin(&items, budget, |s| fails(s)),
                    "n={n} budget={budget}"
                );
                assert_eq!(one.tried, one.trials);
                assert_eq!(batches_one.len(), one.trials);
                assert!(one.trials <= budget);
                for width in [2, 3, 4, 8] {
                    let (wide, batches) = run(width);
                    assert_eq!(wide.kept, one.kept, "n={n} budget={budget} width={width}");
                    assert_eq!(
                        wide.chosen, one.chosen,
                        "n={n} budget={budget} width={width}"
                    );
                    assert_eq!(
                        wide.trials, one.trials,
                        "n={n} budget={budget} width={width}"
                    );
                    // A batch runs past its first failing trial at most `width - 1`.
                    assert!(wide.tried >= wide.trials);
                    assert!(wide.tried <= wide.trials + (width - 1) * wide.chosen.len());
                    assert_eq!(batches.iter().sum::<usize>(), wide.tried);
                    assert!(batches.len() <= batches_one.len());
                }
            }
        }
    }

    #[test]
    fn test_a_wide_batch_takes_fewer_rounds_of_trials() {
        let items: Vec<u32> = (0..16).collect();
        let mut calls = [0usize; 2];
        for (slot, width) in [(0, 1), (1, 4)] {
            ddmin_batched(&items, 100, width, |batch| {
                calls[slot] += 1;
                Ok::<_, ()>(batch.iter().position(|s| s.contains(&13)))
            })
            .unwrap();
        }
        assert!(calls[1] < calls[0], "{calls:?}");
    }

    #[test]
    fn test_an_error_ends_the_reduction() {
        let items: Vec<u32> = (0..8).collect();
        let mut calls = 0;
        let error = ddmin_batched(&items, 100, 2, |_| {
            calls += 1;
            if calls == 2 {
                Err("trial 3 broke")
            } else {
                Ok(None)
            }
        })
        .unwrap_err();
        assert_eq!((error, calls), ("trial 3 broke", 2));
    }
}
