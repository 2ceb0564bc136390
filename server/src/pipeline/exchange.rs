//! The per-request context carried through the stages: what ingress read, what the policy and key
//! stages decided, and what the lookup learned on the way (the nearest candidate, a shadow
//! decision, a vetoed entry, the prompt's vector), so that each stage takes one value instead of a
//! long argument list.

use std::sync::{Arc, OnceLock};

use axum::http::HeaderMap;

use crate::cors::{self, Asker};
use crate::entry::{EntryId, HitKind, Replay, RequestSummary};
use crate::error::GatewayError;
use crate::feedback::PromptKey;
use crate::ingress::{Ingress, Route};
use crate::key::{KeyInput, Keys, Tenant};
use crate::live::LiveSettings;
use crate::outcome::CacheOutcome;
use crate::policy::{self, Policy};
use crate::record::{set_header, Nearest, RecordMeta};
use crate::shadow::ShadowDecision;
use crate::state::AppState;
use crate::timing::unix_ms;

/// One request on its way through the pipeline.
pub(crate) struct Exchange {
    /// `x-reprise-request-id`, the key of the request's record.
    pub id: String,
    pub ingress: Ingress,
    /// The live settings as they were when the request arrived (one snapshot for the whole request).
    pub settings: Arc<LiveSettings>,
    pub policy: Policy,
    pub tenant: Tenant,
    /// Who asks, when a browser does (the request has `Origin`).
    pub browser: Option<Asker>,
    /// What the upstream last answered that asker (CORS headers), for a hit to carry; `None` for
    /// a browser's request when it has not been heard yet, which then goes upstream.
    pub cors: Option<cors::Answer>,
    pub keys: Keys,
    /// Whether the response streams (embeddings never do, whatever the body says).
    pub stream: bool,
    /// `stream_options.include_usage`: the client wants the usage chunk (chat and legacy
    /// completions streams).
    pub include_usage: bool,
    /// The similarity a semantic hit needs: the request's own when stricter, else the floor.
    pub threshold: f32,
    /// The prompt's feedback key, hashed once and only when a path needs it.
    prompt_key: OnceLock<PromptKey>,
    /// The namespace's verify settings, resolved once and only when semantic matching runs.
    verify_plan: OnceLock<crate::verify::settings::VerifyPlan>,
    /// What the lookup found on its way to a miss, reported in the miss's headers and record.
    pub misses: MissNotes,
    /// The prompt's embedding, stored with the answer for semantic matching.
    pub vector: Option<Vec<f32>>,
    /// The trace context (joined to the client's `traceparent`) when traces are exported.
    pub trace: Option<crate::otel::RequestTrace>,
}

/// What a miss reports about the lookup that preceded it.
#[derive(Default)]
pub(crate) struct MissNotes {
    /// The best semantic candidate, and the guard that refused it.
    pub nearest: Nearest,
    /// What semantic matching would have served, in shadow mode.
    pub shadowed: Option<ShadowDecision>,
    /// The entry an operator's verdict kept from being served.
    pub vetoed: Option<EntryId>,
    /// The lookup was skipped for a browser whose CORS answer is not known yet: still a `miss`.
    pub cors_unknown: bool,
    /// What the verify stage did with the candidate (`x-reprise-verify`): the judge's verdict,
    /// `queued` or `dropped`.
    pub verify: Option<String>,
}

impl MissNotes {
    /// Adds the `x-reprise-nearest`, `-guard`, `-nearest-guard`, `-shadow`, `-vetoed` and `-semantic` headers to a
    /// miss's response.
    pub(crate) fn annotate(&self, headers: &mut HeaderMap) {
        if let Some(nearest) = self.nearest.similarity {
            // What the best candidate scored, so thresholds can be tuned from real traffic.
            set_header(headers, "x-reprise-nearest", format!("{nearest:.4}"));
        }
        if let Some(guard) = self.nearest.guard {
            // A guard refused a candidate the threshold would have served: a wrong answer not given.
            set_header(headers, "x-reprise-guard", guard.name().to_owned());
        }
        if let Some(guard) = self.nearest.nearest_guard {
            // The best candidate, whatever it scored, is one no threshold would serve: for tuning.
            set_header(headers, "x-reprise-nearest-guard", guard.name().to_owned());
        }
        if let Some(decision) = &self.shadowed {
            // What `on` would have served: the response itself is the upstream's.
            set_header(headers, "x-reprise-shadow", decision.header());
        }
        if let Some(entry) = self.vetoed {
            set_header(headers, "x-reprise-vetoed", entry.to_string());
        }
        if let Some(verify) = &self.verify {
            set_header(headers, "x-reprise-verify", verify.clone());
        }
        if let Some(reason) = self.nearest.skipped {
            // No vector in time: this miss was matched exactly only.
            set_header(
                headers,
                "x-reprise-semantic",
                format!("skipped; reason={reason}"),
            );
        }
    }
}

impl Exchange {
    /// The policy and key stages: reads the cache controls against the live defaults, and builds the
    /// partition, the exact key and the prompt. Fails on a control or a keyed field that is invalid.
    /// `browser` is the request's asker ([`Asker::of`] its headers), which `handle` derives before
    /// ingress, for its errors.
    pub(crate) fn new(
        state: &AppState,
        ingress: Ingress,
        id: String,
        browser: Option<Asker>,
    ) -> Result<Self, GatewayError> {
        let settings = state.live.current();
        let mut policy =
            policy::from_headers(&ingress.headers, &settings.defaults_for(&ingress.headers))?;
        let api = crate::api::of(ingress.route);
        // The API's own rules (the Responses API's stored responses) may keep entries per key.
        let share = state.cache.settings.share_across_keys & api.rules(&ingress.body, &mut policy);
        let tenant = Tenant::from_headers(&ingress.headers, share);
        // Read once: the hit serves what the lookup was decided on.
        let cors = browser.as_ref().and_then(|b| state.upstream.cors.answer(b));
        let keys = crate::api::keys(&KeyInput {
            route: ingress.route,
            body: &ingress.body,
            headers: &ingress.headers,
            tenant,
            namespace: policy.namespace.as_deref(),
        })?;
        // A client may ask for stricter matching than the operator's floor, never for looser.
        let floor = settings.threshold_floor(policy.namespace.as_deref());
        if let Some(t) = policy.threshold.filter(|t| *t < floor) {
            return Err(GatewayError::invalid(
                format!("`x-reprise-threshold: {t}` is below the configured floor of {floor}; a request may only raise it."),
                Some("x-reprise-threshold"),
            ));
        }
        let include_usage = ingress
            .body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let trace = state.otel.as_ref().map(|otel| {
            otel.begin(
                &ingress.headers,
                format!("/v1{}", ingress.route.upstream_path()),
            )
        });
        Ok(Self {
            trace,
            id,
            stream: ingress.stream && api.streams(),
            include_usage,
            threshold: policy.threshold.unwrap_or(floor),
            ingress,
            settings,
            policy,
            tenant,
            browser,
            cors,
            keys,
            prompt_key: OnceLock::new(),
            verify_plan: OnceLock::new(),
            misses: MissNotes::default(),
            vector: None,
        })
    }

    pub(crate) fn route(&self) -> Route {
        self.ingress.route
    }

    /// The prompt's key for operators' verdicts.
    pub(crate) fn prompt_key(&self) -> PromptKey {
        *self
            .prompt_key
            .get_or_init(|| PromptKey::of(&self.keys.prompt))
    }

    /// The verify settings of this request's namespace.
    pub(crate) fn verify_plan(&self) -> &crate::verify::settings::VerifyPlan {
        self.verify_plan
            .get_or_init(|| self.settings.verify_for(self.policy.namespace.as_deref()))
    }

    /// What an entry stored from this request says about it.
    pub(crate) fn summary(&self) -> RequestSummary {
        RequestSummary {
            route: self.route().name().to_owned(),
            model: self.ingress.model.clone(),
            namespace: self.policy.namespace.clone(),
            tenant: self.tenant.label(),
            prompt: self.keys.prompt.clone(),
            stream: self.stream,
        }
    }

    /// The start of this request's record, as `cache`.
    pub(crate) fn record(&self, cache: CacheOutcome) -> RecordMeta {
        RecordMeta {
            id: self.id.clone(),
            started_at_ms: unix_ms()
                .saturating_sub(self.ingress.clock.start.elapsed().as_millis() as u64),
            method: "POST".into(),
            route: self.route().name().to_owned(),
            model: Some(self.ingress.model.clone()),
            stream: self.ingress.stream,
            cache,
            served: None,
            nearest: self.misses.nearest,
            error: None,
            store_skipped: None,
            trace: self.trace.clone(),
            namespace: self.policy.namespace.clone(),
        }
    }
}

/// An entry found for a request, and how.
pub(crate) struct Found {
    pub entry: Arc<Replay>,
    pub age_s: u64,
    pub how: How,
    /// How a semantic hit was verified (`x-reprise-verified`), when it was.
    pub verified: Option<crate::verify::Verified>,
    /// The judge's verdict on this request, when one was asked (`x-reprise-verify`).
    pub verdict: Option<String>,
}

/// How a request came to be served from an entry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum How {
    Exact,
    Similar(f32),
    /// An identical miss in flight landed.
    Coalesced,
}

impl How {
    pub(crate) fn outcome(self) -> CacheOutcome {
        self.kind().outcome()
    }

    pub(crate) fn kind(self) -> HitKind {
        match self {
            Self::Exact => HitKind::Hit,
            Self::Similar(_) => HitKind::SemanticHit,
            Self::Coalesced => HitKind::Coalesced,
        }
    }

    pub(crate) fn similarity(self) -> Option<f32> {
        match self {
            Self::Similar(s) => Some(s),
            Self::Exact | Self::Coalesced => None,
        }
    }
}
