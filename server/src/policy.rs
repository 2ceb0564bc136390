//! Policy, the stage after ingress: what the client allows the cache to do with this request.
//!
//! Read from standard `Cache-Control` directives and `x-reprise-*` headers, on top of the gateway's
//! configured defaults. A malformed control header is a 400 naming the header: guessing what a client
//! meant by a cache control is how wrong answers get served.

use axum::http::HeaderMap;

use crate::error::GatewayError;
use crate::outcome::CacheOutcome;

/// `x-reprise-cache-mode`, `cache_mode` and the values of `namespace_modes`: written on the wire,
/// in the config file and in flags as `on`, `off`, `read-only`, `write-only`, `exact-only` or `shadow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CacheMode {
    /// Look up and store.
    #[default]
    On,
    /// Neither look up nor store.
    Off,
    /// Look up, never store.
    ReadOnly,
    /// Never look up, store the fresh answer.
    WriteOnly,
    /// Look up and store, exact matches only (no semantic matching).
    ExactOnly,
    /// Like `exact-only`, and the semantic match that `on` would have served is recorded, not
    /// served ([`crate::shadow`]).
    Shadow,
}

impl CacheMode {
    const ALL: [CacheMode; 6] = [
        Self::On,
        Self::Off,
        Self::ReadOnly,
        Self::WriteOnly,
        Self::ExactOnly,
        Self::Shadow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::ReadOnly => "read-only",
            Self::WriteOnly => "write-only",
            Self::ExactOnly => "exact-only",
            Self::Shadow => "shadow",
        }
    }
}

impl std::str::FromStr for CacheMode {
    type Err = String;

    /// Case and surrounding spaces are forgiven, as HTTP header values usually are.
    fn from_str(value: &str) -> Result<Self, String> {
        let wanted = value.trim();
        Self::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                format!(
                    "`{value}` is not one of on, off, read-only, write-only, exact-only, shadow"
                )
            })
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for CacheMode {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        value.parse()
    }
}

impl From<CacheMode> for String {
    fn from(mode: CacheMode) -> Self {
        mode.as_str().to_owned()
    }
}

/// How a hit is paced (`x-reprise-replay`, `replay`): `instant`, `recorded` or
/// `tokens-per-second=N`, the same spelling everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Pacing {
    /// Everything at once.
    #[default]
    Instant,
    /// The original inter-chunk timing, after a near-zero first token.
    Recorded,
    /// A fixed rate of content chunks per second.
    TokensPerSecond(f64),
}

/// Slowest `tokens-per-second` pacing: a 1,000-token answer then takes under three hours, already
/// longer than any client or proxy waits; slower rates only hold a connection open for nothing.
pub const MIN_TOKENS_PER_SECOND: f64 = 0.1;
/// Fastest `tokens-per-second` pacing: one token per microsecond, far below the timer's millisecond
/// resolution, so any faster rate is `instant` under another name.
pub const MAX_TOKENS_PER_SECOND: f64 = 1e6;

impl std::str::FromStr for Pacing {
    type Err = String;

    /// Parses `instant`, `recorded` or `tokens-per-second=N` with N from
    /// [`MIN_TOKENS_PER_SECOND`] to [`MAX_TOKENS_PER_SECOND`]; the error says what was wrong.
    fn from_str(value: &str) -> Result<Self, String> {
        let value = value.trim().to_ascii_lowercase();
        match value.as_str() {
            "instant" => Ok(Self::Instant),
            "recorded" => Ok(Self::Recorded),
            _ => {
                let shape = || format!("`{value}` is not instant, recorded or tokens-per-second=N");
                let rate = value.strip_prefix("tokens-per-second=").ok_or_else(shape)?;
                let text = rate.trim();
                let rate: f64 = text.parse().map_err(|_| shape())?;
                // NaN fails both comparisons, so it is refused with the infinities.
                if (MIN_TOKENS_PER_SECOND..=MAX_TOKENS_PER_SECOND).contains(&rate) {
                    Ok(Self::TokensPerSecond(rate))
                } else {
                    Err(format!(
                        // Quoted as written: `{rate}` would print 1e-300 as 300 zeros.
                        "tokens-per-second must be from {MIN_TOKENS_PER_SECOND} to {MAX_TOKENS_PER_SECOND}, not {text}"
                    ))
                }
            }
        }
    }
}

impl std::fmt::Display for Pacing {
    /// The canonical spelling; a rate prints in the shortest form that parses back to itself
    /// (within the bounds, never in exponent notation).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Instant => f.write_str("instant"),
            Self::Recorded => f.write_str("recorded"),
            Self::TokensPerSecond(rate) => write!(f, "tokens-per-second={rate}"),
        }
    }
}

impl TryFrom<String> for Pacing {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        value.parse()
    }
}

impl From<Pacing> for String {
    fn from(pacing: Pacing) -> Self {
        pacing.to_string()
    }
}

/// The cache decisions for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub lookup: bool,
    pub store: bool,
    /// Semantic matching allowed (false for `exact-only`).
    pub semantic: bool,
    /// Accept only entries younger than this (`Cache-Control: max-age`).
    pub max_age_s: Option<u64>,
    pub ttl_s: u64,
    pub pacing: Pacing,
    pub namespace: Option<String>,
    /// Why lookup was skipped while storing: reported as `refresh`.
    pub refresh: bool,
    /// `x-reprise-threshold`: a stricter similarity for this request (checked against the floor
    /// by the lookup, which knows the namespace's floor).
    pub threshold: Option<f32>,
    /// Shadow mode: search semantically and record what would be served, serve exact hits only.
    pub shadow: bool,
}

impl Policy {
    /// The outcome of a request that goes upstream under this policy.
    pub fn miss_outcome(&self) -> CacheOutcome {
        if self.refresh {
            CacheOutcome::Refresh
        } else if !self.lookup && !self.store {
            CacheOutcome::Bypass
        } else {
            CacheOutcome::Miss
        }
    }
}

/// The configured defaults a request's headers apply to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    pub mode: CacheMode,
    pub ttl_s: u64,
    pub pacing: Pacing,
}

/// Longest time to live an entry may have (ten years).
pub const MAX_TTL_S: u64 = 10 * 365 * 24 * 3600;

fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, GatewayError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            GatewayError::invalid(
                format!("Header `{name}` must be visible ASCII."),
                Some(name),
            )
        }),
    }
}

pub fn from_headers(headers: &HeaderMap, defaults: &Defaults) -> Result<Policy, GatewayError> {
    let mode = match header(headers, "x-reprise-cache-mode")? {
        Some(v) => v.parse::<CacheMode>().map_err(|_| {
            GatewayError::invalid(
                format!("`x-reprise-cache-mode: {v}` is not one of on, off, read-only, write-only, exact-only, shadow."),
                Some("x-reprise-cache-mode"),
            )
        })?,
        None => defaults.mode,
    };
    let mut policy = Policy {
        lookup: matches!(
            mode,
            CacheMode::On | CacheMode::ReadOnly | CacheMode::ExactOnly | CacheMode::Shadow
        ),
        store: matches!(
            mode,
            CacheMode::On | CacheMode::WriteOnly | CacheMode::ExactOnly | CacheMode::Shadow
        ),
        shadow: mode == CacheMode::Shadow,
        semantic: matches!(mode, CacheMode::On | CacheMode::ReadOnly),
        max_age_s: None,
        ttl_s: defaults.ttl_s,
        pacing: defaults.pacing,
        namespace: None,
        refresh: mode == CacheMode::WriteOnly,
        threshold: None,
    };
    // HTTP semantics: unknown directives are ignored, known ones must be well-formed.
    for value in headers.get_all("cache-control") {
        let value = value.to_str().map_err(|_| {
            GatewayError::invalid(
                "`Cache-Control` must be visible ASCII.",
                Some("cache-control"),
            )
        })?;
        for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let (name, arg) = match directive.split_once('=') {
                Some((n, a)) => (
                    n.trim().to_ascii_lowercase(),
                    Some(a.trim().trim_matches('"')),
                ),
                None => (directive.to_ascii_lowercase(), None),
            };
            match name.as_str() {
                "no-cache" => {
                    if policy.lookup && policy.store {
                        policy.refresh = true;
                    }
                    policy.lookup = false;
                    policy.semantic = false;
                }
                "no-store" => policy.store = false,
                "max-age" => {
                    let age = arg.and_then(delta_seconds).ok_or_else(|| {
                        GatewayError::invalid(
                            format!(
                                "`Cache-Control: {directive}` needs a whole number of seconds."
                            ),
                            Some("cache-control"),
                        )
                    })?;
                    policy.max_age_s = Some(policy.max_age_s.map_or(age, |a| a.min(age)));
                }
                _ => {}
            }
        }
    }
    if !policy.store {
        policy.refresh = false;
    }
    if let Some(v) = header(headers, "x-reprise-ttl")? {
        policy.ttl_s = v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|t| (1..=MAX_TTL_S).contains(t))
            .ok_or_else(|| {
                GatewayError::invalid(
                    format!(
                        "`x-reprise-ttl: {v}` must be a number of seconds from 1 to {MAX_TTL_S}."
                    ),
                    Some("x-reprise-ttl"),
                )
            })?;
    }
    if let Some(v) = header(headers, "x-reprise-replay")? {
        policy.pacing = v.parse::<Pacing>().map_err(|why| {
            GatewayError::invalid(
                format!("Invalid `x-reprise-replay: {v}`: {why}."),
                Some("x-reprise-replay"),
            )
        })?;
    }
    if let Some(v) = header(headers, "x-reprise-threshold")? {
        let t = v
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|t| (0.0..=1.0).contains(t))
            .ok_or_else(|| {
                GatewayError::invalid(
                    format!("`x-reprise-threshold: {v}` must be a similarity between 0 and 1."),
                    Some("x-reprise-threshold"),
                )
            })?;
        policy.threshold = Some(t);
    }
    if let Some(v) = header(headers, "x-reprise-namespace")? {
        policy.namespace = Some(namespace(v, "x-reprise-namespace")?);
    }
    Ok(policy)
}

/// RFC 9111 `delta-seconds` (`1*DIGIT`): no sign, no fraction; a value too large to hold is taken
/// as 2^31 seconds, as section 1.2.2 asks, rather than refused.
fn delta_seconds(arg: &str) -> Option<u64> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(arg.parse::<u64>().map_or(1 << 31, |s| s.min(1 << 31)))
}

/// What a namespace name is, in requests, admin routes and the per-namespace settings alike.
pub const NAMESPACE_RULE: &str = "1 to 128 characters of letters, digits and - _ . : /";

/// True for a name [`namespace`] keeps as it is (already trimmed): the only names the
/// per-namespace settings may use, since a request never carries another.
pub fn is_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
}

/// A namespace as requests and admin routes accept it (trimmed), or a 400 naming `param`.
pub fn namespace(value: &str, param: &str) -> Result<String, GatewayError> {
    let v = value.trim();
    if is_namespace(v) {
        Ok(v.to_owned())
    } else {
        Err(GatewayError::invalid(
            format!("`{param}` must be {NAMESPACE_RULE}"),
            Some(param),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn defaults() -> Defaults {
        Defaults {
            mode: CacheMode::On,
            ttl_s: 604_800,
            pacing: Pacing::Instant,
        }
    }

    fn policy(pairs: &[(&'static str, &str)]) -> Result<Policy, GatewayError> {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        from_headers(&headers, &defaults())
    }

    #[test]
    fn defaults_look_up_and_store() {
        let p = policy(&[]).expect("ok");
        assert!(p.lookup && p.store && p.semantic && !p.refresh);
        assert_eq!(p.ttl_s, 604_800);
        assert_eq!(p.miss_outcome().as_str(), "miss");
    }

    #[test]
    fn cache_control_directives() {
        let p = policy(&[("cache-control", "no-cache")]).expect("ok");
        assert!(!p.lookup && p.store && p.refresh);
        assert_eq!(p.miss_outcome().as_str(), "refresh");
        let p = policy(&[("cache-control", "no-store, max-age=30")]).expect("ok");
        assert!(p.lookup && !p.store);
        assert_eq!(p.max_age_s, Some(30));
        let p = policy(&[("cache-control", "no-cache, no-store")]).expect("ok");
        assert_eq!(p.miss_outcome().as_str(), "bypass");
        assert!(policy(&[("cache-control", "max-age=soon")]).is_err());
        assert!(policy(&[("cache-control", "private")]).is_ok());
    }

    #[test]
    fn huge_max_age_is_taken_as_two_to_the_31_seconds() {
        let p = policy(&[("cache-control", "max-age=99999999999999999999999999")]).expect("ok");
        assert_eq!(p.max_age_s, Some(1 << 31));
        let p = policy(&[("cache-control", "max-age=\"60\"")]).expect("ok");
        assert_eq!(p.max_age_s, Some(60));
    }

    #[test]
    fn pacing_bounds_are_inclusive() {
        assert_eq!(
            "tokens-per-second=0.1".parse(),
            Ok(Pacing::TokensPerSecond(0.1))
        );
        assert_eq!(
            "tokens-per-second=1e6".parse(),
            Ok(Pacing::TokensPerSecond(1e6))
        );
        let err = "tokens-per-second=1e-300"
            .parse::<Pacing>()
            .expect_err("too slow");
        assert!(err.contains("from 0.1 to 1000000"), "{err}");
        // The value is quoted as the client wrote it, not expanded to 300 digits.
        assert!(err.ends_with("not 1e-300"), "{err}");
    }

    #[test]
    fn modes_and_pacings_are_strings_in_their_canonical_spelling() {
        for mode in CacheMode::ALL {
            assert_eq!(mode.to_string().parse(), Ok(mode));
            let json = serde_json::to_value(mode).expect("json");
            assert_eq!(json, mode.as_str());
            assert_eq!(serde_json::from_value::<CacheMode>(json).ok(), Some(mode));
        }
        assert_eq!(" Read-Only ".parse(), Ok(CacheMode::ReadOnly));
        for (written, canonical) in [
            ("instant", "instant"),
            ("RECORDED", "recorded"),
            ("tokens-per-second=50", "tokens-per-second=50"),
            ("tokens-per-second=1e6", "tokens-per-second=1000000"),
            ("tokens-per-second= 0.1", "tokens-per-second=0.1"),
        ] {
            let pacing: Pacing = written.parse().expect(written);
            assert_eq!(pacing.to_string(), canonical);
            assert_eq!(canonical.parse(), Ok(pacing));
            assert_eq!(serde_json::to_value(pacing).expect("json"), canonical);
        }
        let err = serde_json::from_value::<Pacing>(serde_json::json!("fast")).expect_err("fast");
        assert!(err.to_string().contains("`fast` is not instant"), "{err}");
    }

    #[test]
    fn reprise_headers_and_their_errors() {
        let p = policy(&[("x-reprise-cache-mode", "off")]).expect("ok");
        assert_eq!(p.miss_outcome().as_str(), "bypass");
        let p = policy(&[("x-reprise-cache-mode", "read-only")]).expect("ok");
        assert!(p.lookup && !p.store);
        let p = policy(&[("x-reprise-cache-mode", "write-only")]).expect("ok");
        assert_eq!(p.miss_outcome().as_str(), "refresh");
        let p = policy(&[("x-reprise-cache-mode", "exact-only")]).expect("ok");
        assert!(p.lookup && p.store && !p.semantic);
        let p = policy(&[
            ("x-reprise-ttl", "60"),
            ("x-reprise-replay", "tokens-per-second=50"),
            ("x-reprise-namespace", "team-a"),
        ])
        .expect("ok");
        assert_eq!((p.ttl_s, p.pacing), (60, Pacing::TokensPerSecond(50.0)));
        assert_eq!(p.namespace.as_deref(), Some("team-a"));
        for (name, value) in [
            ("x-reprise-cache-mode", "sometimes"),
            ("x-reprise-ttl", "0"),
            ("x-reprise-ttl", "abc"),
            ("x-reprise-replay", "fast"),
            ("x-reprise-replay", "tokens-per-second=-1"),
            ("x-reprise-namespace", "has space"),
            ("x-reprise-threshold", "1.5"),
            ("x-reprise-threshold", "high"),
            ("x-reprise-threshold", "NaN"),
            ("x-reprise-threshold", "inf"),
            ("x-reprise-threshold", "-0.5"),
            ("x-reprise-ttl", "-1"),
            ("x-reprise-ttl", "18446744073709551616"),
            ("x-reprise-ttl", "1e3"),
            ("x-reprise-ttl", "315360001"),
            // Each of these panicked a worker on a streamed hit (issue 14).
            ("x-reprise-replay", "tokens-per-second=1e-300"),
            ("x-reprise-replay", "tokens-per-second=5e-324"),
            ("x-reprise-replay", "tokens-per-second=1e-19"),
            ("x-reprise-replay", "tokens-per-second=0.09"),
            ("x-reprise-replay", "tokens-per-second=1000001"),
            ("x-reprise-replay", "tokens-per-second=NaN"),
            ("x-reprise-replay", "tokens-per-second=inf"),
            ("x-reprise-replay", "tokens-per-second=0"),
            ("cache-control", "max-age=-1"),
            ("cache-control", "max-age=1.5"),
            ("cache-control", "max-age=+5"),
            ("cache-control", "max-age="),
        ] {
            let err = policy(&[(name, value)]).expect_err(value);
            assert_eq!(err.body()["error"]["param"], name);
        }
    }
}
