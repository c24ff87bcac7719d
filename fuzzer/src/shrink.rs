//! Delta debugging (Zeller's ddmin) over a list of items: the smallest
//! subset, 1-minimal, for which a test still fails. The campaign shrinks a
//! finding's faults with it, each trial replayed from the root.

/// A 1-minimal subset of `items` on which `fails` holds (given that it holds
/// on all of `items`), trying at most `max_trials` subsets; `fails` is not
/// called on the whole set. Order is kept.
pub fn ddmin<T: Clone>(
    items: &[T],
    max_trials: usize,
    mut fails: impl FnMut(&[T]) -> bool,
) -> (Vec<T>, usize) {
    let mut current: Vec<T> = items.to_vec();
    let mut trials = 0usize;
    let mut n = 2usize;
    while current.len() >= 2 && trials < max_trials {
        let chunks = split(&current, n);
        let mut reduced = false;
        // A chunk alone.
        for chunk in &chunks {
            if trials >= max_trials {
                break;
            }
            trials += 1;
            if fails(chunk) {
                current = chunk.clone();
                n = 2;
                reduced = true;
                break;
            }
        }
        if !reduced && chunks.len() > 2 {
            // Everything but a chunk.
            for i in 0..chunks.len() {
                if trials >= max_trials {
                    break;
                }
                let complement: Vec<T> = chunks
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .flat_map(|(_, c)| c.iter().cloned())
                    .collect();
                trials += 1;
                if fails(&complement) {
                    current = complement;
                    n = (n - 1).max(2);
                    reduced = true;
                    break;
                }
            }
        }
        if !reduced {
            if n >= current.len() {
                break;
            }
            n = (2 * n).min(current.len());
        }
    }
    // The empty set too: a failure that needs no fault at all.
    if current.len() == 1 && trials < max_trials {
        trials += 1;
        if fails(&[]) {
            current.clear();
        }
    }
    (current, trials)
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
}
