//! Fixtures shared by Reprise's criterion benches: realistic OpenAI stream bytes, built once per bench.

use bytes::Bytes;

/// An OpenAI-style chat stream of `tokens` content chunks, split into network-sized pieces of `piece` bytes.
pub fn chat_stream(tokens: usize, piece: usize) -> Vec<Bytes> {
    let mut all = String::new();
    all.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n");
    for i in 0..tokens {
        all.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    all.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    all.as_bytes()
        .chunks(piece.max(1))
        .map(Bytes::copy_from_slice)
        .collect()
}
