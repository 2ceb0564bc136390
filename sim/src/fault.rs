//! Faults the simulator can inject, parsed from `--fault` or the `x-sim-fault` request header.

/// Where counts appear (`cut=N`), N is the number of content tokens sent before the fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status and the route's error body (OpenAI's shape, or Anthropic's on
    /// `/v1/messages`, typed by status): `status=503`. `overloaded` is `status=529` (Anthropic's
    /// `overloaded_error`) and `rate-limit` is `status=429` (with `retry-after`), by those names.
    Status(u16),
    /// Never send a response head: `hang`.
    Hang,
    /// End the stream cleanly after N tokens, without a finish reason or `[DONE]`: `cut[=N]`.
    Cut(u32),
    /// Break the connection after N tokens (a non-streamed body: halfway): `abort[=N]`.
    Abort(u32),
    /// Send one event whose data is not JSON after N tokens, then carry on: `malformed[=N]`.
    Malformed(u32),
    /// Send an OpenAI `error` event after N tokens and stop: `error-event[=N]`.
    ErrorEvent(u32),
    /// Tool-call arguments that are not valid JSON: `bad-tool-args`.
    BadToolArgs,
    /// Answer `302 Found` to `/v1/sim/redirected`, which serves a complete answer to a `GET`: `redirect`.
    Redirect,
    /// The last choice stops with `finish_reason: "content_filter"`: `content-filter`.
    ContentFilter,
    /// A named `event: error` frame (data without an `error` member) after N tokens, then the
    /// stream carries on to a clean end: `error-frame[=N]`.
    ErrorFrame(u32),
    /// Bytes that are not UTF-8 inside the answer's text (the Nth token of a stream): `bad-utf8[=N]`.
    BadUtf8(u32),
    /// A stream sends its whole answer, finish reason (and usage) included, then stalls before
    /// `[DONE]` with the connection open: `stall-at-done`. A non-streamed answer is unaffected.
    StallAtDone,
    /// A Responses API stream sends `response.failed` after N deltas and stops; a non-streamed
    /// response comes back with status `failed`: `failed[=N]`.
    Failed(u32),
    /// A Responses API answer is a `refusal` content part instead of text: `refusal`.
    Refusal,
    /// Read the request, then close the connection without a response: `close-early`.
    /// A transport fault: only as the `x-sim-fault` header (see [`super::transport`]).
    CloseEarly,
    /// Read the request, then answer a status line that is not HTTP and close: `garbage-status`.
    /// A transport fault: only as the `x-sim-fault` header.
    GarbageStatus,
}

const DEFAULT_AFTER: u32 = 2;

impl Fault {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        let (name, value) = match spec.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (spec, None),
        };
        let count = |v: Option<&str>| -> Result<u32, String> {
            v.map_or(Ok(DEFAULT_AFTER), |v| {
                v.parse()
                    .map_err(|_| format!("`{v}` is not a token count in fault `{spec}`"))
            })
        };
        match name {
            "status" => {
                let code: u16 = value
                    .ok_or_else(|| "fault `status` needs a code, e.g. status=503".to_owned())?
                    .parse()
                    .map_err(|_| format!("bad status in fault `{spec}`"))?;
                if !(400..=599).contains(&code) {
                    return Err(format!("fault status must be 400..=599, got {code}"));
                }
                Ok(Self::Status(code))
            }
            // Anthropic's two load errors, by the names its docs give them.
            "overloaded" => Ok(Self::Status(529)),
            "rate-limit" => Ok(Self::Status(429)),
            "hang" => Ok(Self::Hang),
            "cut" => Ok(Self::Cut(count(value)?)),
            "abort" => Ok(Self::Abort(count(value)?)),
            "malformed" => Ok(Self::Malformed(count(value)?)),
            "error-event" => Ok(Self::ErrorEvent(count(value)?)),
            "bad-tool-args" => Ok(Self::BadToolArgs),
            "redirect" => Ok(Self::Redirect),
            "content-filter" => Ok(Self::ContentFilter),
            "error-frame" => Ok(Self::ErrorFrame(count(value)?)),
            "bad-utf8" => Ok(Self::BadUtf8(count(value)?)),
            "stall-at-done" => Ok(Self::StallAtDone),
            "failed" => Ok(Self::Failed(count(value)?)),
            "refusal" => Ok(Self::Refusal),
            "close-early" => Ok(Self::CloseEarly),
            "garbage-status" => Ok(Self::GarbageStatus),
            other => Err(format!(
                "unknown fault `{other}` (expected status=CODE, overloaded, rate-limit, hang, cut[=N], abort[=N], malformed[=N], error-event[=N], bad-tool-args, redirect, content-filter, error-frame[=N], bad-utf8[=N], stall-at-done, failed[=N], refusal, close-early, garbage-status)"
            )),
        }
    }
}

impl Fault {
    /// Faults the connection applies rather than the handler: they cannot be set for every
    /// request, since the connection sees only the header.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::CloseEarly | Self::GarbageStatus)
    }
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// The command line's `--fault`: every fault but the transport ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fault = Self::parse(s)?;
        if fault.is_transport() {
            return Err(format!(
                "`{s}` is a transport fault: send it per request as the `x-sim-fault` header"
            ));
        }
        Ok(fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_fault() {
        assert_eq!(Fault::parse("status=503"), Ok(Fault::Status(503)));
        assert_eq!(Fault::parse("overloaded"), Ok(Fault::Status(529)));
        assert_eq!(Fault::parse("rate-limit"), Ok(Fault::Status(429)));
        assert_eq!(Fault::parse("hang"), Ok(Fault::Hang));
        assert_eq!(Fault::parse("cut"), Ok(Fault::Cut(2)));
        assert_eq!(Fault::parse("cut=5"), Ok(Fault::Cut(5)));
        assert_eq!(Fault::parse("abort=1"), Ok(Fault::Abort(1)));
        assert_eq!(Fault::parse("malformed"), Ok(Fault::Malformed(2)));
        assert_eq!(Fault::parse("error-event=0"), Ok(Fault::ErrorEvent(0)));
        assert_eq!(Fault::parse("bad-tool-args"), Ok(Fault::BadToolArgs));
        assert_eq!(Fault::parse("redirect"), Ok(Fault::Redirect));
        assert_eq!(Fault::parse("content-filter"), Ok(Fault::ContentFilter));
        assert_eq!(Fault::parse("error-frame=1"), Ok(Fault::ErrorFrame(1)));
        assert_eq!(Fault::parse("bad-utf8"), Ok(Fault::BadUtf8(2)));
        assert_eq!(Fault::parse("stall-at-done"), Ok(Fault::StallAtDone));
        assert_eq!(Fault::parse("close-early"), Ok(Fault::CloseEarly));
        assert_eq!(Fault::parse("garbage-status"), Ok(Fault::GarbageStatus));
        assert!(Fault::parse("status=200").is_err());
        assert!(Fault::parse("explode").is_err());
        assert!(Fault::parse("cut=x").is_err());
    }
}
