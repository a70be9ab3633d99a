//! rslock's uncontended cycle (acquire, then release, of one name on one
//! Redis) on a tokio current-thread runtime, for `scripts/rslock-compare`:
//! `rslock-cycles URL SECONDS` prints the cycles per second after 200
//! warm-up cycles.

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(secs)) = (args.get(1), args.get(2).and_then(|s| s.parse::<f64>().ok()))
    else {
        eprintln!("usage: rslock-cycles URL SECONDS");
        std::process::exit(64);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let manager = rslock::LockManager::new(vec![url.clone()]);
        let ttl = Duration::from_secs(30);
        let cycle = || async {
            let guard = manager.acquire("rslock-compare", ttl).await.expect("a free lock");
            guard.release().await;
        };
        for _ in 0..200 {
            cycle().await;
        }
        let (started, window) = (Instant::now(), Duration::from_secs_f64(secs));
        let mut n = 0u64;
        while started.elapsed() < window {
            cycle().await;
            n += 1;
        }
        println!("{:.0}", n as f64 / started.elapsed().as_secs_f64());
    });
}
