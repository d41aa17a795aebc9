//! The inference thread pool: persistent workers that spin between the
//! parallel regions of a forward pass and keep their cores.
//!
//! A token runs a few hundred short parallel regions (each matrix product,
//! the attention heads, the activations). A pool whose idle workers go to
//! sleep between them (rayon's) pays a wake-up for each, and on a machine
//! with other work running a sleeping worker's core goes to that work: the
//! next region waits for the scheduler. Here a worker that finds no task
//! spins for [`SPIN`] (as ggml's threadpool and OpenMP's do) and only then
//! parks; the thread that starts a region works in it too.
//!
//! A region is `n` tasks, each index run exactly once by whichever thread
//! claims it (one atomic counter), and the region ends when all `n` have
//! finished. Which thread runs a task never changes what it computes, so
//! results are the same for any thread count. The workers that were slow
//! to arrive are not waited for: a region's end needs its tasks done, not
//! every worker's presence.
//!
//! Rayon stays for the work that is not a forward pass (loading,
//! repacking, conversion): its work stealing suits large uneven jobs, and
//! spinning there would only burn the cores.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks: longer than the gaps
/// inside a token (sampling, a step of the server's batch), short enough
/// that an idle server's workers sleep.
pub const SPIN: Duration = Duration::from_millis(3);

/// One parallel region, on the stack of the thread that runs it.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
}

/// The most tasks of one region: a larger `run` gives each task a run of indices.
const MAX_TASKS: usize = 0xffff;

/// The state word: the region's epoch (bits 32..64), its task count (16..32)
/// and its next unclaimed task (0..16). A task is claimed by moving it on by
/// one, which succeeds only while the word is unchanged since it was read.
fn unpack(s: u64) -> (usize, usize) {
    (((s >> 16) & 0xffff) as usize, (s & 0xffff) as usize)
}

/// What the pool's threads share.
struct Shared {
    state: AtomicU64,
    /// The current region (valid while it has unfinished tasks).
    job: AtomicPtr<Job<'static>>,
    /// Tasks of the current region finished.
    finished: AtomicUsize,
    /// A task of the current region panicked.
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

impl Shared {
    /// Claims and runs tasks of the region the state shows, if it has any
    /// left; returns whether it ran one.
    fn help(&self) -> bool {
        let mut ran = false;
        loop {
            let s = self.state.load(Ordering::Acquire);
            let (n, next) = unpack(s);
            if next >= n {
                return ran;
            }
            let job = self.job.load(Ordering::Acquire);
            if self.state.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            // The claim succeeded with the state word unchanged since it was read, and
            // `job` was read after it: a later region's job is written only once this
            // region's tasks are all claimed, which would have changed the word.
            // SAFETY: `job` points to the `Job` on the stack of the thread running this
            // region, which does not return before this claimed task is counted finished.
            let job = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| (job.task)(next))).is_err() {
                self.panicked.store(true, Ordering::Release);
            }
            self.finished.fetch_add(1, Ordering::Release);
            ran = true;
        }
    }
}

/// The pool: `threads - 1` workers and the thread that starts a region.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Held by the thread running a region; another thread that wants one
    /// at the same time runs its tasks itself.
    busy: Mutex<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` threads (at least one: the caller's).
    pub fn new(threads: usize) -> Result<Pool, String> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            finished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let s = shared.clone();
            let w = std::thread::Builder::new()
                .name(format!("krafla-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| format!("cannot start {threads} threads: {e}"))?;
            workers.push(w);
        }
        Ok(Pool { shared, threads, busy: Mutex::new(()), workers })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `task(i)` for every i in 0..n across the pool's threads, the
    /// caller's included, and returns when all have finished. A panic in a
    /// task is raised again here.
    pub fn run(&self, n: usize, task: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        let guard = match self.busy.try_lock() {
            Ok(g) if self.threads > 1 && n > 1 && !IN_WORKER.get() => g,
            // one thread, one task, a task of a region, or the pool busy with another thread's region
            _ => return (0..n).for_each(task),
        };
        if n > MAX_TASKS {
            let per = n.div_ceil(MAX_TASKS);
            let runs = |t: usize| (t * per..((t + 1) * per).min(n)).for_each(task);
            drop(guard);
            return self.run(n.div_ceil(per), &runs);
        }
        let s = &*self.shared;
        let job = Job { task };
        s.finished.store(0, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        s.job.store(&job as *const Job as *mut Job<'static>, Ordering::Release);
        let epoch = (s.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        s.state.store(epoch << 32 | (n as u64) << 16, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.help();
        while s.finished.load(Ordering::Acquire) < n {
            std::hint::spin_loop();
        }
        // every task is claimed and finished: no thread touches `job` again
        drop(guard);
        if s.panicked.load(Ordering::Acquire) {
            panic!("a task of a parallel region panicked");
        }
    }

    /// Runs `f` with this pool as the one [`run`] and the helpers below use
    /// on this thread.
    pub fn install<R>(self: &Arc<Self>, f: impl FnOnce() -> R) -> R {
        let before = INSTALLED.with(|p| p.replace(Some(self.clone())));
        struct Restore(Option<Arc<Pool>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let before = self.0.take();
                INSTALLED.with(|p| *p.borrow_mut() = before);
            }
        }
        let _restore = Restore(before);
        f()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A worker: runs tasks as they come, spins [`SPIN`] without any, then parks.
fn worker(s: &Shared) {
    IN_WORKER.set(true);
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    while !s.shutdown.load(Ordering::Relaxed) {
        if s.help() {
            idle_since = Instant::now();
            continue;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(1024) || idle_since.elapsed() < SPIN {
            continue;
        }
        let seen = s.state.load(Ordering::SeqCst);
        let l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        // a region published after `sleeping` was raised wakes us; one published
        // before shows in the state
        if s.state.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
            let _l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
        idle_since = Instant::now();
    }
}

thread_local! {
    static INSTALLED: RefCell<Option<Arc<Pool>>> = const { RefCell::new(None) };
    /// A pool's worker: a region started inside one of its tasks runs on it alone.
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// The pool of threads not inside [`Pool::install`]: `init`'s, else one
/// thread per core.
static GLOBAL: OnceLock<Arc<Pool>> = OnceLock::new();

/// Sets the pool every thread uses outside [`Pool::install`] (`-t`); the
/// first call wins.
pub fn init(threads: usize) -> Result<(), String> {
    let pool = Arc::new(Pool::new(threads)?);
    let _ = GLOBAL.set(pool);
    Ok(())
}

/// The pool this thread's regions run on.
pub fn current() -> Arc<Pool> {
    if let Some(p) = INSTALLED.with(|p| p.borrow().clone()) {
        return p;
    }
    GLOBAL
        .get_or_init(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            Arc::new(Pool::new(n).unwrap_or_else(|_| Pool::new(1).expect("a pool of one thread starts no thread")))
        })
        .clone()
}

/// The current pool's thread count.
pub fn threads() -> usize {
    current().threads()
}

/// `task(i)` for i in 0..n on the current pool.
pub fn for_each(n: usize, task: impl Fn(usize) + Sync) {
    current().run(n, &task);
}

/// A slice's base pointer, shared by the tasks of one region, each of which
/// takes its own disjoint part of it.
struct Parts<T>(*mut T);
// SAFETY: the tasks reach only disjoint elements (each index is claimed once),
// and `T: Send` lets an element move to another thread's use.
unsafe impl<T: Send> Sync for Parts<T> {}

/// `f(i, chunk)` for each `chunk`-long piece of `out` (the last may be
/// shorter), `per_task` pieces to a task.
pub fn chunks_mut<T: Send>(out: &mut [T], chunk: usize, per_task: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let pieces = out.len().div_ceil(chunk);
    let per_task = per_task.max(1);
    let len = out.len();
    let base = Parts(out.as_mut_ptr());
    let base = &base;
    for_each(pieces.div_ceil(per_task), |t| {
        for i in t * per_task..((t + 1) * per_task).min(pieces) {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: piece i is elements start..start + n of `out`, within it, and
            // no other task touches them (piece i belongs to task t alone).
            let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
            f(i, piece);
        }
    });
}

/// `f(i, a_i, b_i)` for the i-th `ca`-long piece of `a` and `cb`-long piece
/// of `b`, one task each, for as many pieces as both have whole.
pub fn zip_chunks_mut<A: Send, B: Send>(
    a: &mut [A],
    ca: usize,
    b: &mut [B],
    cb: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let (ca, cb) = (ca.max(1), cb.max(1));
    let pieces = (a.len() / ca).min(b.len() / cb);
    let (pa, pb) = (Parts(a.as_mut_ptr()), Parts(b.as_mut_ptr()));
    let (pa, pb) = (&pa, &pb);
    for_each(pieces, |i| {
        // SAFETY: pieces i of `a` and `b` lie within them (i < pieces) and belong to
        // task i alone.
        let (x, y) = unsafe {
            (std::slice::from_raw_parts_mut(pa.0.add(i * ca), ca), std::slice::from_raw_parts_mut(pb.0.add(i * cb), cb))
        };
        f(i, x, y);
    });
}

/// `f(item)` for each item of `items`, each item mutably by one task.
pub fn each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    chunks_mut(items, 1, 1, |_, one| f(&mut one[0]));
}

/// `f(i)` for i in 0..n, in order.
pub fn map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    chunks_mut(&mut out, 1, 1, |i, slot| slot[0] = Some(f(i)));
    out.into_iter().map(|r| r.expect("every task ran")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_any_thread_count() {
        for threads in [1, 2, 3, 8] {
            let pool = Arc::new(Pool::new(threads).unwrap());
            pool.install(|| {
                for n in [0, 1, 2, 7, 100, 5000] {
                    let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    for_each(n, |i| {
                        counts[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{threads} threads, {n} tasks");
                    let squares = map(n, |i| i * i);
                    assert_eq!(squares, (0..n).map(|i| i * i).collect::<Vec<_>>());
                    let mut v = vec![0usize; n];
                    chunks_mut(&mut v, 3, 2, |i, c| c.iter_mut().enumerate().for_each(|(k, x)| *x = i * 3 + k));
                    assert_eq!(v, (0..n).collect::<Vec<_>>());
                }
            });
        }
    }

    #[test]
    fn regions_from_several_threads_at_once_and_nested() {
        let pool = Arc::new(Pool::new(3).unwrap());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    pool.install(|| {
                        for _ in 0..200 {
                            let total = AtomicUsize::new(0);
                            for_each(10, |i| {
                                // a region inside a task runs on its thread
                                for_each(3, |j| {
                                    total.fetch_add(i * 3 + j, Ordering::Relaxed);
                                });
                            });
                            assert_eq!(total.load(Ordering::Relaxed), (0..30).sum::<usize>());
                        }
                    })
                });
            }
        });
    }

    #[test]
    fn workers_park_and_wake() {
        let pool = Arc::new(Pool::new(2).unwrap());
        pool.install(|| {
            for_each(4, |_| {});
            std::thread::sleep(SPIN * 3);
            let ran = AtomicUsize::new(0);
            for_each(64, |_| {
                ran.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(ran.load(Ordering::Relaxed), 64);
        });
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_goes_on() {
        let pool = Arc::new(Pool::new(2).unwrap());
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(8, &|i| assert!(i != 5))));
        assert!(r.is_err());
        let ran = AtomicUsize::new(0);
        pool.run(8, &|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 8);
    }
}
