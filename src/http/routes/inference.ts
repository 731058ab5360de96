// The OpenAI-compatible routes: tokenize, route, and proxy to the chosen worker.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { RouteInput } from '../../core/router.js'
import { MAX_SESSION_ID } from '../../core/session-affinity.js'
import { KvrError } from '../../errors.js'
import { readU64 } from '../../codec/json.js'
import { chatPromptText } from '../../tokenizer/tokenizer.js'
import type { ChatMessage } from '../../tokenizer/tokenizer.js'
import type { ProxyCall } from '../proxy/proxy.js'
import { chatSchema, completionSchema } from '../schemas.js'
import { BODY_BYTES, PROXIED, headerValue, latencyObjectives, overrides } from '../request.js'
import type { RequestWithBytes } from '../request.js'
import type { HttpContext } from '../context.js'

export function inferenceRoutes(fastify: FastifyInstance, ctx: HttpContext): void {
  const { router, cfg, tokenizer, proxy } = ctx
  const noTokenizer = (): null => {
    if (cfg.mode === 'kv')
      throw new KvrError(
        'KVR_ERR_NO_TOKENIZER',
        'a text prompt needs a tokenizer in kv mode: start the router with --tokenizer PATH (a tokenizer.json) or --tokenizer bytes, or send token ids',
      )
    return null
  }
  // vLLM's request field, with its defaults: a completion gets the tokenizer's BOS, a rendered chat not
  const specialTokens = (body: Record<string, unknown>, dflt: boolean): boolean =>
    typeof body.add_special_tokens === 'boolean' ? body.add_special_tokens : dflt
  const tokensOf = async (text: string, body: Record<string, unknown>): Promise<ArrayLike<number> | null> =>
    tokenizer === null ? noTokenizer() : tokenizer.encode(text, specialTokens(body, true))

  const commonRoute = (req: FastifyRequest, body: Record<string, unknown>, tokens: ArrayLike<number> | null, textLength: number): RouteInput => {
    const input: RouteInput = { tokens: tokens ?? [], isl: tokens === null ? Math.ceil(textLength / 4) : tokens.length }
    const nv = (body.nvext ?? {}) as Record<string, unknown>
    const pin = headerValue(req, 'x-worker-instance-id') ?? headerValue(req, 'x-dynamo-worker-instance-id') ?? nv.backend_instance_id
    if (pin !== undefined && pin !== null) input.workerId = readU64(pin, 'nvext.backend_instance_id')
    const rank = headerValue(req, 'x-dp-rank') ?? headerValue(req, 'x-data-parallel-rank') ?? nv.dp_rank
    if (rank !== undefined && rank !== null) {
      // a header is text: Number() would read "" and "0x0" as rank 0
      const r = typeof rank === 'string' ? (/^[0-9]{1,10}$/.test(rank) ? Number(rank) : Number.NaN) : Number(rank)
      if (!Number.isInteger(r) || r < 0 || r > 0xffffffff)
        throw new KvrError('KVR_ERR_INVALID_REQUEST', `dp rank must be a decimal integer in [0, 2^32), got ${JSON.stringify(rank)}`)
      // a rank names one rank of one worker; without the worker it would be dropped unseen
      if (input.workerId === undefined)
        throw new KvrError(
          'KVR_ERR_INVALID_REQUEST',
          'a dp rank (x-dp-rank, nvext.dp_rank) needs the worker it belongs to (x-worker-instance-id or nvext.backend_instance_id)',
        )
      input.dpRank = r
    }
    const session = headerValue(req, 'x-dynamo-session-id')
    if (session !== undefined && session !== '') {
      if (session.length > MAX_SESSION_ID) throw new KvrError('KVR_ERR_INVALID_REQUEST', `x-dynamo-session-id is longer than ${MAX_SESSION_ID} characters`)
      input.sessionId = session
    }
    const hints = nv.agent_hints as { priority?: number } | undefined
    if (hints?.priority !== undefined) input.priority = hints.priority
    latencyObjectives(req, nv.slo, 'nvext.slo', input)
    const ov = overrides(nv.router_config_override)
    if (ov !== undefined) input.overrides = ov
    return input
  }

  /**
   * What the proxy needs of a request, taken from its body. The body, its text and the prompt in
   * it would otherwise stay reachable for the whole stream through the request object and this
   * function's frame, and the prompt is most of an open stream's heap; the request lets go of
   * them here, and the proxy drops its own references (the bytes, and the parsed body a
   * request-plane worker's request is built from) at the first token, when no retry can need them.
   */
  const proxyCall = async (path: string, chat: boolean, req: FastifyRequest): Promise<ProxyCall> => {
    const body = req.body as Record<string, unknown>
    const nv = (body.nvext ?? {}) as { token_data?: number[] }
    let tokens: ArrayLike<number> | null
    let textLength = 0
    if (Array.isArray(nv.token_data) && nv.token_data.length > 0) {
      tokens = nv.token_data
    } else if (chat) {
      if (tokenizer === null) {
        textLength = chatPromptText(body.messages as ChatMessage[]).length
        tokens = noTokenizer()
      } else {
        const kwargs = body.chat_template_kwargs as Record<string, unknown> | undefined
        const chatRequest = {
          messages: body.messages as unknown[],
          addGenerationPrompt: body.add_generation_prompt !== false,
          kwargs: kwargs ?? null,
          tools: (body.tools as unknown[] | undefined) ?? null,
        }
        tokens = await tokenizer.encodeChat(chatRequest, specialTokens(body, false))
      }
    } else {
      const p = body.prompt
      if (typeof p === 'string') {
        if (p.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
        textLength = p.length
        tokens = await tokensOf(p, body)
      } else {
        const arr = p as unknown[]
        if (arr.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
        if (typeof arr[0] === 'number') tokens = arr as number[]
        else if (arr.length === 1 && typeof arr[0] === 'string') {
          textLength = (arr[0] as string).length
          tokens = await tokensOf(arr[0] as string, body)
        } else if (arr.length === 1 && Array.isArray(arr[0])) tokens = arr[0] as number[]
        else
          throw new KvrError(
            'KVR_ERR_INVALID_REQUEST',
            'prompt must be a string, an array of token ids, or one of them in an array (batches are not supported)',
          )
      }
    }
    if (tokens !== null && tokens.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
    const input = commonRoute(req, body, tokens, textLength)
    const model = typeof body.model === 'string' ? body.model : cfg.modelName
    const payload = (req as RequestWithBytes)[BODY_BYTES] ?? Buffer.from(JSON.stringify(body))
    ;(req as RequestWithBytes)[BODY_BYTES] = undefined
    req.body = undefined
    ;(req as RequestWithBytes)[PROXIED] = true
    // the parsed body too: a worker on Dynamo's request plane is sent a PreprocessedRequest built from it
    return { path, payload, stream: body.stream === true, route: input, model, kind: chat ? 'chat' : 'completions', body }
  }

  /**
   * Counts in dynamo_frontend_requests_total an inference request answered before the proxy took
   * it: refused by its key, size, JSON, schema, prompt or chat template, or by a router shutting
   * down. Each of those is an answer a client got, and error-rate dashboards read this series.
   */
  const countUnproxied =
    (path: string) =>
    (req: FastifyRequest, reply: FastifyReply, done: () => void): void => {
      if ((req as RequestWithBytes)[PROXIED] !== true) {
        const b = req.body
        const body = b !== null && typeof b === 'object' && !Array.isArray(b) ? (b as Record<string, unknown>) : {}
        router.metrics.request(typeof body.model === 'string' ? body.model : cfg.modelName, path, body.stream === true ? 'stream' : 'unary', reply.statusCode)
      }
      done()
    }

  // returns nothing: the proxy answers the client itself, errors included, so fastify holds no
  // promise for the life of a stream
  const inference =
    (path: string, chat: boolean) =>
    (req: FastifyRequest, reply: FastifyReply): void => {
      proxyCall(path, chat, req)
        .then((call) => proxy.handle(reply, call))
        .catch((err: unknown) => {
          if (reply.sent || reply.raw.headersSent) reply.log.error({ err }, 'proxying failed after the response began')
          else void reply.send(err)
        })
    }
  fastify.post('/v1/completions', { schema: { body: completionSchema }, onResponse: countUnproxied('/v1/completions') }, inference('/v1/completions', false))
  fastify.post(
    '/v1/chat/completions',
    { schema: { body: chatSchema }, onResponse: countUnproxied('/v1/chat/completions') },
    inference('/v1/chat/completions', true),
  )
}
