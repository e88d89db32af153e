/// <reference types="vitest/config" />
import react from '@vitejs/plugin-react'
import { defineConfig } from 'vite'

// Built assets are served by Django (whitenoise) under STATIC_URL, so the bundle's base is /static/.
// The dev server proxies the API to the Django/uvicorn process so the page uses same-origin URLs.
export default defineConfig({
  base: '/static/',
  plugins: [react()],
  server: {
    proxy: {
      '/api': 'http://127.0.0.1:8000',
      '/v1': 'http://127.0.0.1:8000',
    },
  },
  test: {
    environment: 'jsdom',
    setupFiles: ['./src/test/setup.ts'],
    css: false,
    testTimeout: 30_000, // CI shares 2 cores; userEvent typing is slow there
    env: { TZ: 'UTC' }, // times show in the browser's zone (src/format.ts); pin it so expected labels hold anywhere
  },
})
