# One image for every kv-router command (serve, mocker, replay); docker-compose.yml runs it as
# the router, the simulated engines and the load generator.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json ./
COPY src src
COPY workers workers
COPY bench bench
COPY test test
COPY scripts scripts
# `npm ci` builds dist/ through the prepare script; the dev dependencies go afterwards
RUN npm ci && npm prune --omit=dev

FROM node:20-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules node_modules
COPY --from=build /app/dist dist
USER node
# The router's V8 flags (src/runtime/v8-flags.ts: a fixed 64 MB young generation, no memory reducer, an
# old generation grown by 100% and kept to at least 128 MB; the sizes are the main thread's, the
# shards and tokenizer threads size their own heaps):
# Node refuses the young-generation ones in NODE_OPTIONS, so they are on the command line.
ENTRYPOINT ["node", "--min-semi-space-size=64", "--max-semi-space-size=64", "--no-memory-reducer", "--heap-growing-percent=100", "--initial-old-space-size=128", "dist/src/main.js"]
CMD ["serve"]
