import '@mantine/core/styles.css'
import '@mantine/charts/styles.css'
import { MantineProvider, createTheme } from '@mantine/core'
import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { StrictMode } from 'react'
import { createRoot } from 'react-dom/client'
import { Navigate, RouterProvider, createBrowserRouter } from 'react-router'
import { Shell } from './Shell'
import { AdapterDetail } from './pages/AdapterDetail'
import { Adapters } from './pages/Adapters'
import { ApiKeys } from './pages/ApiKeys'
import { Login } from './pages/Login'
import { Audit } from './pages/Audit'
import { Nodes } from './pages/Nodes'
import { Playground } from './pages/Playground'
import { Usage } from './pages/Usage'

const queryClient = new QueryClient({ defaultOptions: { queries: { retry: 1, refetchOnWindowFocus: false } } })
const theme = createTheme({ primaryColor: 'indigo', defaultRadius: 'md' })

const router = createBrowserRouter([
  { path: '/login', element: <Login /> },
  {
    path: '/',
    element: <Shell />,
    children: [
      { index: true, element: <Navigate to="/adapters" replace /> },
      { path: 'adapters', element: <Adapters /> },
      { path: 'adapters/:name', element: <AdapterDetail /> },
      { path: 'keys', element: <ApiKeys /> },
      { path: 'playground', element: <Playground /> },
      { path: 'usage', element: <Usage /> },
      { path: 'operator/nodes', element: <Nodes /> },
      { path: 'operator/audit', element: <Audit /> },
    ],
  },
])

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <MantineProvider theme={theme}>
      <QueryClientProvider client={queryClient}>
        <RouterProvider router={router} />
      </QueryClientProvider>
    </MantineProvider>
  </StrictMode>,
)
