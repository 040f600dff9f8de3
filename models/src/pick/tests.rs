//! The picks against their definitions: the argmax's ties and NaNs, and
//! the draws' frequencies against the softmax at two temperatures; with
//! the `cuda` feature and a GPU, the kernel against the CPU version.

use candle_core::{Device, Result, Tensor};

use super::{pick_tokens, Pick};

#[test]
fn argmax_rows_take_the_first_largest_and_skip_nans() -> Result<()> {
    let logits = Tensor::new(
        &[
            [1.0f32, 3.0, 3.0, -1.0],
            [f32::NAN, 0.5, f32::NAN, 0.25],
            [f32::NAN; 4],
        ],
        &Device::Cpu,
    )?;
    let ids = pick_tokens(&logits, &[Pick::Argmax; 3])?;
    assert_eq!(ids, vec![1, 1, 0]);
    // One pick per row, and no zero or negative temperature.
    assert!(pick_tokens(&logits, &[Pick::Argmax; 2]).is_err());
    let cold = Pick::Draw {
        temperature: 0.0,
        seed: 1,
    };
    assert!(pick_tokens(&logits, &[cold; 3]).is_err());
    Ok(())
}

/// Frequencies of 8000 draws (one row per seed) against the softmax of
/// `logits / temperature`, each within five standard deviations.
fn check_draws(logits: &[f32], temperature: f32) -> Result<()> {
    let n = 8000;
    let rows: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
    let t = Tensor::from_vec(rows, (n, logits.len()), &Device::Cpu)?;
    let picks: Vec<Pick> = (0..n as u64)
        .map(|seed| Pick::Draw { temperature, seed })
        .collect();
    let ids = pick_tokens(&t, &picks)?;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / temperature) as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    for (i, wi) in w.iter().enumerate() {
        let p = wi / total;
        let seen = ids.iter().filter(|&&id| id as usize == i).count() as f64;
        let sd = (n as f64 * p * (1.0 - p)).sqrt().max(1.0);
        assert!(
            (seen - n as f64 * p).abs() < 5.0 * sd,
            "T {temperature}, token {i}: {seen} draws, {:.0} expected",
            n as f64 * p
        );
    }
    Ok(())
}

#[test]
fn draws_follow_the_softmax_at_their_temperature() -> Result<()> {
    let logits = [2.0f32, 1.0, 0.0, -1.0, f32::NEG_INFINITY];
    check_draws(&logits, 1.0)?;
    check_draws(&logits, 0.5)?;
    check_draws(&logits, 2.0)?;
    // The same seed draws the same token.
    let t = Tensor::new(&[logits, logits], &Device::Cpu)?;
    let p = Pick::Draw {
        temperature: 1.0,
        seed: 42,
    };
    let ids = pick_tokens(&t, &[p, p])?;
    assert_eq!(ids[0], ids[1]);
    Ok(())
}

/// The kernel against the CPU version over a vocabulary of 49152: the
/// same hash gives the same ids, but for the rare row whose two best
/// perturbed logits are within the log's rounding.
#[cfg(feature = "cuda")]
#[test]
fn cuda_picks_match_the_cpu() -> Result<()> {
    let Some(gpu) = crate::test_util::test_cuda() else {
        return Ok(());
    };
    let (rows, vocab) = (64, 49152);
    let logits = (Tensor::randn(0f32, 3.0, (rows, vocab), &Device::Cpu)?).contiguous()?;
    let picks: Vec<Pick> = (0..rows as u64)
        .map(|r| match r % 3 {
            0 => Pick::Argmax,
            1 => Pick::Draw {
                temperature: 0.7,
                seed: r * 7919,
            },
            _ => Pick::Draw {
                temperature: 1.0,
                seed: u64::MAX - r,
            },
        })
        .collect();
    let cpu = pick_tokens(&logits, &picks)?;
    let on_gpu = pick_tokens(&logits.to_device(&gpu)?, &picks)?;
    let same = cpu.iter().zip(&on_gpu).filter(|(a, b)| a == b).count();
    assert!(same >= rows - 1, "{same} of {rows} rows agree");
    for (r, p) in picks.iter().enumerate() {
        if *p == Pick::Argmax {
            assert_eq!(cpu[r], on_gpu[r], "argmax row {r}");
        }
    }
    Ok(())
}
