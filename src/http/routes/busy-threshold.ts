// Busy thresholds (Dynamo's /busy_threshold), read and set at run time.
import type { FastifyInstance } from 'fastify'
import { thresholdSchema } from '../schemas.js'
import type { HttpContext } from '../context.js'

export function busyThresholdRoutes(fastify: FastifyInstance, ctx: HttpContext): void {
  const { router, cfg } = ctx
  const thresholdsJson = (): object => {
    const t = router.scheduler.busyThresholds()
    return {
      thresholds: [
        {
          model: cfg.modelName,
          active_decode_blocks_threshold: t.activeDecodeBlocksThreshold,
          active_prefill_tokens_threshold: t.activePrefillTokensThreshold,
          active_prefill_tokens_threshold_frac: t.activePrefillTokensThresholdFrac,
        },
      ],
    }
  }
  fastify.get('/busy_threshold', async () => thresholdsJson())
  fastify.post('/busy_threshold', { schema: { body: thresholdSchema } }, async (req) => {
    const b = req.body as Record<string, number | null | undefined>
    const patch: Record<string, number | null> = {}
    if (b.active_decode_blocks_threshold !== undefined) patch.activeDecodeBlocksThreshold = b.active_decode_blocks_threshold
    if (b.active_prefill_tokens_threshold !== undefined) patch.activePrefillTokensThreshold = b.active_prefill_tokens_threshold
    if (b.active_prefill_tokens_threshold_frac !== undefined) patch.activePrefillTokensThresholdFrac = b.active_prefill_tokens_threshold_frac
    if (Object.keys(patch).length > 0) router.scheduler.setBusyThresholds(patch)
    return thresholdsJson()
  })
}
