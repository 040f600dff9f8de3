//! `hearth`: serve models over an OpenAI-compatible HTTP API, and manage the
//! model catalogue.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use hearth_server::config::{Cli, Command, ModelsCommand};

/// Large blocks (model weights, KV pools) on transparent huge pages: a
/// decode step streams every weight, and 2 MiB pages read faster
/// (`HEARTH_HUGE_PAGES=0` turns this off).
#[global_allocator]
static ALLOC: hearth_kernels::HugePageAlloc = hearth_kernels::HugePageAlloc;

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn main() -> anyhow::Result<()> {
    // candle asks rayon for its thread count on every op; without this it
    // re-reads /proc/cpuinfo each time, which costs a quarter of decode speed.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("HEARTH_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => runtime()?.block_on(hearth_server::serve::run(args)),
        Command::Models(ModelsCommand::List(store)) => hearth_server::models_cli::list(&store),
        Command::Models(ModelsCommand::Pull { id, store }) => {
            hearth_server::models_cli::pull(id.as_deref(), &store)
        }
        Command::Models(ModelsCommand::ImportAdapter(args)) => {
            runtime()?.block_on(hearth_server::models_cli::import_adapter(&args))
        }
        Command::Keys(command) => runtime()?.block_on(hearth_server::keys_cli::keys(command)),
        Command::Projects(command) => {
            runtime()?.block_on(hearth_server::keys_cli::projects(command))
        }
        Command::Endpoints(command) => {
            runtime()?.block_on(hearth_server::endpoints_cli::endpoints(command))
        }
        Command::Iam(command) => runtime()?.block_on(hearth_server::iam_cli::iam(command)),
    }
}
