import react from '@vitejs/plugin-react'
import { defineConfig } from 'vite'

// Dev server proxies the API to the Django/uvicorn process so the page can use same-origin URLs,
// as it will in production behind one host. https://vite.dev/config/server-options#server-proxy
export default defineConfig({
  plugins: [react()],
  server: {
    proxy: {
      '/api': 'http://127.0.0.1:8000',
      '/v1': 'http://127.0.0.1:8000',
    },
  },
})
