// JSON schemas of the request bodies fastify validates (ajv, no type coercion).
export const u64Schema = {
  anyOf: [
    { type: 'integer', minimum: 0 },
    { type: 'string', pattern: '^(0|[1-9][0-9]{0,19})$' },
  ],
}
export const overrideSchema = {
  type: 'object',
  properties: {
    overlap_score_weight: { type: 'number', minimum: 0 },
    overlap_score_credit: { type: 'number', minimum: 0 },
    router_temperature: { type: 'number', minimum: 0 },
    assume_kv_reuse: { type: 'boolean' },
    track_prefill_tokens: { type: 'boolean' },
  },
}
export const nvextSchema = {
  type: 'object',
  properties: {
    backend_instance_id: u64Schema,
    dp_rank: { type: 'integer', minimum: 0, maximum: 0xffffffff },
    token_data: { type: 'array', items: { type: 'integer' } },
    agent_hints: { type: 'object', properties: { priority: { type: 'integer', minimum: -2147483648, maximum: 2147483647 } } },
    router_config_override: overrideSchema,
    // latency objectives, ms; their range is checked with the headers' (latencyObjectives)
    slo: { type: ['object', 'null'], properties: { ttft_ms: { type: ['number', 'null'] }, tpot_ms: { type: ['number', 'null'] } } },
  },
}
export const completionSchema = {
  type: 'object',
  required: ['prompt'],
  properties: {
    model: { type: 'string' },
    prompt: { anyOf: [{ type: 'string' }, { type: 'array' }] },
    stream: { type: 'boolean' },
    add_special_tokens: { type: 'boolean' },
    max_tokens: { type: ['integer', 'null'], minimum: 0 },
    nvext: nvextSchema,
  },
}
export const contentPartSchema = {
  type: 'object',
  required: ['type'],
  properties: { type: { type: 'string' }, text: { type: 'string' } },
  if: { properties: { type: { const: 'text' } } },
  then: { required: ['text'] },
}
export const chatSchema = {
  type: 'object',
  required: ['messages'],
  properties: {
    model: { type: 'string' },
    // content: text, a list of parts, or null (an assistant turn that only calls tools); a part
    // is an object naming its type, and a text part's text is a string (a number there would
    // be read as empty text)
    messages: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        required: ['role'],
        properties: { role: { type: 'string' }, content: { anyOf: [{ type: 'string' }, { type: 'array', items: contentPartSchema }, { type: 'null' }] } },
      },
    },
    stream: { type: 'boolean' },
    add_special_tokens: { type: 'boolean' },
    add_generation_prompt: { type: 'boolean' },
    chat_template_kwargs: { type: 'object' },
    tools: { type: 'array' },
    max_tokens: { type: ['integer', 'null'], minimum: 0 },
    max_completion_tokens: { type: ['integer', 'null'], minimum: 0 },
    nvext: nvextSchema,
  },
}
export const workerSchema = {
  type: 'object',
  required: ['url'],
  properties: {
    id: u64Schema,
    worker_id: u64Schema,
    url: { type: 'string', pattern: '^https?://' },
    block_size: { type: 'integer', minimum: 1, maximum: 65536 },
    capacity: { type: 'integer', minimum: 0 },
    total_kv_blocks: { type: 'integer', minimum: 0 },
    device_type: { type: 'string', enum: ['gpu', 'cpu', 'cuda'] },
    dp_size: { type: 'integer', minimum: 1, maximum: 1024 },
    max_num_batched_tokens: { type: 'integer', minimum: 1 },
    // the engine's own KV events (ZMQ); checked as tcp://HOST:PORT by the route
    kv_events_endpoint: { type: 'string', pattern: '^tcp://' },
    replay_endpoint: { type: 'string', pattern: '^tcp://' },
    kv_events_topic: { type: 'string' },
    // the router decides for it (POST /v1/route) and neither probes it nor proxies to it
    decisions_only: { type: 'boolean' },
  },
}
export const thresholdSchema = {
  type: 'object',
  // a misspelt threshold is refused, not dropped with a 200 and the old value left in force
  additionalProperties: false,
  properties: {
    model: { type: 'string' },
    active_decode_blocks_threshold: { type: ['number', 'null'], minimum: 0, maximum: 1 },
    active_prefill_tokens_threshold: { type: ['number', 'null'], minimum: 0 },
    active_prefill_tokens_threshold_frac: { type: ['number', 'null'], minimum: 0 },
  },
}
