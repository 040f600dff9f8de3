//! Running an engine's loop on a thread pool of its own.
//!
//! By default an engine's loop runs its parallel work (matmuls, attention,
//! sampling) on rayon's global pool, which every shared model uses. An
//! engine given `threads` (a dedicated endpoint's reservation) builds a pool
//! of that many threads and runs its whole loop inside it, so the model's
//! parallel work is split over its own threads only and never queues behind
//! another engine's steps on the global pool. The loop itself then runs on
//! one of the pool's threads, which takes part in every parallel step.

/// Runs `body` on this thread (`threads` = `None`) or on a new pool of
/// `threads` threads named `name-N`, returning when it ends. Falls back to
/// this thread when the pool cannot be built (logged).
pub(crate) fn run_on_pool(threads: Option<usize>, name: &str, body: impl FnOnce() + Send) {
    let Some(n) = threads else {
        return body();
    };
    let prefix = name.to_string();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .thread_name(move |i| format!("{prefix}-{i}"))
        .build();
    match pool {
        Ok(pool) => pool.install(body),
        Err(e) => {
            tracing::warn!("cannot build a pool of {n} threads ({e}); using the shared one");
            body()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_runs_on_a_pool_of_the_given_size() {
        let mut seen = None;
        run_on_pool(Some(3), "t", || {
            seen = Some((
                rayon::current_num_threads(),
                rayon::current_thread_index().is_some(),
                std::thread::current().name().map(String::from),
            ))
        });
        let (n, on_pool, name) = seen.unwrap();
        assert_eq!(n, 3);
        assert!(on_pool);
        assert!(name.unwrap().starts_with("t-"));
    }

    #[test]
    fn without_threads_the_body_runs_here() {
        let here = std::thread::current().id();
        let mut ran_on = None;
        run_on_pool(None, "t", || ran_on = Some(std::thread::current().id()));
        assert_eq!(ran_on, Some(here));
    }
}
