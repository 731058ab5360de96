# One image for every kv-router command (serve, mocker, replay); docker-compose.yml runs it as
# the router, the simulated engines and the load generator.
# Node 22: an LTS line still supported (package.json's engines also admit 20.18.1 for development).
FROM node:22-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json ./
COPY src src
COPY workers workers
COPY bench bench
COPY test test
COPY support support
COPY scripts scripts
# `npm ci` builds dist/ through the prepare script; the dev dependencies go afterwards
RUN npm ci && npm prune --omit=dev

FROM node:22-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules node_modules
COPY --from=build /app/dist dist
USER node
# The executable's shebang passes the router's V8 flags (src/runtime/v8-flags.ts, written by the
# build); Node refuses the young-generation ones in NODE_OPTIONS.
ENTRYPOINT ["/app/dist/src/main.js"]
CMD ["serve"]
