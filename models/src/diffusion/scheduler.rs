//! The scheduler: its config (`scheduler/scheduler_config.json` onto
//! candle-transformers' scheduler configs) and the denoising step.
//!
//! Timesteps, sigmas, input scaling and DDIM steps are candle-transformers';
//! the Euler-ancestral step is taken here, with the same formula as its
//! `EulerAncestralDiscreteScheduler::step`, because that one draws its
//! ancestral noise from the device RNG (not seedable on the CPU) and
//! generation must be reproducible from the request's seed.

use super::config::refuse_set;
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_transformers::models::stable_diffusion::{
    ddim::DDIMSchedulerConfig,
    euler_ancestral_discrete::EulerAncestralDiscreteSchedulerConfig,
    schedulers::{BetaSchedule, PredictionType, Scheduler, SchedulerConfig, TimestepSpacing},
};
use serde::Deserialize;
use serde_json::Value;

/// `scheduler/scheduler_config.json`: the noise schedule, whatever the
/// scheduler class; generation runs Euler-ancestral, or DDIM (eta 0) when
/// the class is DDIMScheduler.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SchedulerJson {
    #[serde(rename = "_class_name")]
    pub class_name: Option<String>,
    #[serde(default = "default_beta_start")]
    pub beta_start: f64,
    #[serde(default = "default_beta_end")]
    pub beta_end: f64,
    pub beta_schedule: Option<String>,
    #[serde(default = "default_train_steps")]
    pub num_train_timesteps: usize,
    pub prediction_type: Option<String>,
    pub timestep_spacing: Option<String>,
    #[serde(default)]
    pub steps_offset: usize,
    pub trained_betas: Option<Value>,
    #[serde(default)]
    pub rescale_betas_zero_snr: bool,
}

fn default_beta_start() -> f64 {
    0.00085
}
fn default_beta_end() -> f64 {
    0.012
}
fn default_train_steps() -> usize {
    1000
}

/// The scheduler generation runs, with its config.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SchedulerKind {
    EulerAncestral(EulerAncestralDiscreteSchedulerConfig),
    Ddim(DDIMSchedulerConfig),
}

impl SchedulerJson {
    pub(crate) fn is_ddim(&self) -> bool {
        self.class_name.as_deref() == Some("DDIMScheduler")
    }

    pub(crate) fn spacing_name(&self) -> &str {
        match self.timestep_spacing.as_deref() {
            Some(s) => s,
            // diffusers' defaults: DDIM "leading", the Euler schedulers "linspace".
            None if self.is_ddim() => "leading",
            None => "linspace",
        }
    }

    pub(crate) fn to_candle(&self) -> Result<SchedulerKind> {
        const F: &str = "scheduler/scheduler_config.json";
        refuse_set(F, "trained_betas", &self.trained_betas)?;
        if self.rescale_betas_zero_snr {
            bail!("{F}: rescale_betas_zero_snr = true is not supported")
        }
        if self.num_train_timesteps < 2 {
            bail!(
                "{F}: num_train_timesteps = {} is too small",
                self.num_train_timesteps
            )
        }
        let beta_schedule = match self.beta_schedule.as_deref().unwrap_or("scaled_linear") {
            "scaled_linear" => BetaSchedule::ScaledLinear,
            "linear" => BetaSchedule::Linear,
            "squaredcos_cap_v2" => BetaSchedule::SquaredcosCapV2,
            other => bail!("{F}: beta_schedule = {other:?} is not supported"),
        };
        let prediction_type = match self.prediction_type.as_deref().unwrap_or("epsilon") {
            "epsilon" => PredictionType::Epsilon,
            "v_prediction" => PredictionType::VPrediction,
            "sample" if self.is_ddim() => PredictionType::Sample,
            other => bail!("{F}: prediction_type = {other:?} is not supported"),
        };
        let timestep_spacing = match self.spacing_name() {
            "leading" => TimestepSpacing::Leading,
            "linspace" => TimestepSpacing::Linspace,
            "trailing" => TimestepSpacing::Trailing,
            other => bail!("{F}: timestep_spacing = {other:?} is not supported"),
        };
        Ok(if self.is_ddim() {
            SchedulerKind::Ddim(DDIMSchedulerConfig {
                beta_start: self.beta_start,
                beta_end: self.beta_end,
                beta_schedule,
                eta: 0.0,
                steps_offset: self.steps_offset,
                prediction_type,
                train_timesteps: self.num_train_timesteps,
                timestep_spacing,
            })
        } else {
            SchedulerKind::EulerAncestral(EulerAncestralDiscreteSchedulerConfig {
                beta_start: self.beta_start,
                beta_end: self.beta_end,
                beta_schedule,
                steps_offset: self.steps_offset,
                prediction_type,
                train_timesteps: self.num_train_timesteps,
                timestep_spacing,
            })
        })
    }
}

impl SchedulerKind {
    pub(crate) fn train_timesteps(&self) -> usize {
        match self {
            Self::EulerAncestral(c) => c.train_timesteps,
            Self::Ddim(c) => c.train_timesteps,
        }
    }
}

/// One generation's scheduler state.
pub(crate) struct Sampler {
    inner: Box<dyn Scheduler>,
    /// Euler-ancestral: sigma of each timestep (then 0 after the last).
    euler: Option<(PredictionType, Vec<f64>)>,
}

impl Sampler {
    pub(crate) fn new(kind: &SchedulerKind, steps: usize) -> Result<Self> {
        if steps == 0 || steps > kind.train_timesteps() {
            bail!(
                "steps must be between 1 and {} (got {steps})",
                kind.train_timesteps()
            )
        }
        match kind {
            SchedulerKind::Ddim(c) => Ok(Self {
                inner: c.build(steps)?,
                euler: None,
            }),
            SchedulerKind::EulerAncestral(c) => {
                let inner = c.build(steps)?;
                // The scheduler's sigmas, read through add_noise(0, 1, t) = sigma(t).
                let zero = Tensor::zeros(1, DType::F64, &Device::Cpu)?;
                let one = Tensor::ones(1, DType::F64, &Device::Cpu)?;
                let sigmas = inner
                    .timesteps()
                    .iter()
                    .map(|&t| {
                        inner
                            .add_noise(&zero, one.clone(), t)?
                            .to_vec1::<f64>()
                            .map(|v| v[0])
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Self {
                    inner,
                    euler: Some((c.prediction_type, sigmas)),
                })
            }
        }
    }

    pub(crate) fn timesteps(&self) -> &[usize] {
        self.inner.timesteps()
    }

    pub(crate) fn init_noise_sigma(&self) -> f64 {
        self.inner.init_noise_sigma()
    }

    pub(crate) fn scale_model_input(&self, sample: Tensor, timestep: usize) -> Result<Tensor> {
        self.inner.scale_model_input(sample, timestep)
    }

    /// Step `index` (of `timesteps()`): the next sample from the model's
    /// output; `noise` gives standard-normal noise shaped like `sample` when
    /// the step is ancestral.
    pub(crate) fn step(
        &mut self,
        index: usize,
        model_output: &Tensor,
        sample: &Tensor,
        noise: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let timestep = self.timesteps()[index];
        let Some((prediction, sigmas)) = &self.euler else {
            return self.inner.step(model_output, timestep, sample);
        };
        let sigma_from = sigmas[index];
        let sigma_to = sigmas.get(index + 1).copied().unwrap_or(0.0);
        let pred_original = match prediction {
            PredictionType::Epsilon => (sample - (model_output * sigma_from)?)?,
            PredictionType::VPrediction => {
                let s2 = sigma_from * sigma_from + 1.0;
                ((model_output * (-sigma_from / s2.sqrt()))? + (sample / s2)?)?
            }
            PredictionType::Sample => bail!("prediction_type sample is not supported by Euler"),
        };
        let sigma_up = (sigma_to.powi(2) * (sigma_from.powi(2) - sigma_to.powi(2))
            / sigma_from.powi(2))
        .sqrt();
        let sigma_down = (sigma_to.powi(2) - sigma_up.powi(2)).sqrt();
        let derivative = ((sample - pred_original)? / sigma_from)?;
        let prev = (sample + (derivative * (sigma_down - sigma_from))?)?;
        if sigma_up > 0.0 {
            prev + (noise()? * sigma_up)?
        } else {
            Ok(prev)
        }
    }
}
